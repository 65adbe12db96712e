"""Batch admission in the gateway on an in-memory Kubernetes: size caps (400), queue quotas
(429), credit reservations (402) — and the pure checks behind them (llmbatch.core.admission)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmbatch.api.resources import BatchFileSpec, BatchPoolSpec
from llmbatch.core import admission
from llmbatch.gateway.kube import Conflict
from tests.fixtures.gateway import FakeGateway, auth

NS = "team-a"


def rows(n: int, model: str = "llama", max_tokens: int | None = 100) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        out.append(
            {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    return out


def jsonl(data: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in data)


def add_pool(gw: FakeGateway, spec: dict[str, Any] | None = None, **status: Any) -> None:
    base = {
        "models": [{"name": "llama", "source": "/m"}],
        "gpusPerSlot": 1,
        "tiers": {
            "standard": {
                "drainTargetSeconds": 60,
                "pricing": {"inputPerMillion": "3", "outputPerMillion": "6"},
            }
        },
    }
    gw.kube.pools.append(
        {"metadata": {"name": "pool-a"}, "spec": {**base, **(spec or {})}, "status": status}
    )


def add_account(gw: FakeGateway, limit: str, namespace: str = NS) -> None:
    gw.kube.objects[("creditaccounts", namespace, "default")] = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "CreditAccount",
        "metadata": {"name": "default", "namespace": namespace, "resourceVersion": "1"},
        "spec": {"limit": limit, "currency": "USD"},
    }


def account_status(gw: FakeGateway, namespace: str = NS) -> dict[str, Any]:
    status: dict[str, Any] = gw.kube.objects[("creditaccounts", namespace, "default")].get(
        "status", {}
    )
    return status


def upload(gw: FakeGateway, key: str, data: bytes) -> str:
    resp = gw.client.post(
        "/v1/files", headers=auth(key), files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def create(gw: FakeGateway, key: str, file_id: str | None = None, **extra: Any) -> Any:
    body: dict[str, Any] = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
    if file_id is not None:
        body["input_file_id"] = file_id
    return gw.client.post("/v1/batches", headers=auth(key), json={**body, **extra})


def batches(gw: FakeGateway) -> list[dict[str, Any]]:
    return [obj for (plural, _, _), obj in gw.kube.objects.items() if plural == "batches"]


# --- credit --------------------------------------------------------------------------------------


def test_upload_records_what_the_estimate_needs(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    # only a private pool may take rows without an output-token limit (seed 000)
    add_pool(
        fake_gateway,
        {"billing": {"mode": "GPUTime"}, "limits": {"requireOutputTokenLimit": False}},
    )
    unlimited = {**rows(1, max_tokens=None)[0], "custom_id": "no-limit"}
    file_id = upload(fake_gateway, key, jsonl([*rows(3), unlimited]))
    spec = fake_gateway.kube.objects[("batchfiles", NS, file_id)]["spec"]
    assert spec["model"] == "llama"
    assert spec["outputTokenLimits"] == 300
    assert spec["requestsWithoutOutputLimit"] == 1


def test_a_model_name_too_long_for_the_batchfile_is_left_off(fake_gateway: FakeGateway) -> None:
    """BatchFile.spec.model holds 256 characters (no pool serves a longer name): a longer one
    is not recorded, so the API server takes the BatchFile, and the batch is estimated as one
    whose model has no pool (validation then fails it with model_not_found)."""
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    file_id = upload(fake_gateway, key, jsonl(rows(2, model="m" * 257)))
    spec = fake_gateway.kube.objects[("batchfiles", NS, file_id)]["spec"]
    assert "model" not in spec
    BatchFileSpec.model_validate(spec)  # what the CRD schema checks
    assert create(fake_gateway, key, file_id).status_code == 200
    assert account_status(fake_gateway).get("reservations") is None
    (batch,) = batches(fake_gateway)
    assert "llmbatch.io/credit-reserved" not in batch["metadata"]["annotations"]
    # a name of exactly the limit is still recorded
    file_id = upload(fake_gateway, key, jsonl(rows(2, model="m" * 256)))
    assert fake_gateway.kube.objects[("batchfiles", NS, file_id)]["spec"]["model"] == "m" * 256


def test_creation_reserves_the_estimate_at_the_tier_price(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    data = jsonl(rows(4))
    resp = create(fake_gateway, key, upload(fake_gateway, key, data))
    assert resp.status_code == 200, resp.text
    input_tokens = -(-len(data) // 3)
    expected = (input_tokens * 3 + 400 * 6) / 1_000_000
    status = account_status(fake_gateway)
    (entry,) = status["reservations"]
    assert entry["batch"] == "batch-" + resp.json()["id"].removeprefix("batch_")
    assert entry["amount"] == f"{expected:.6f}"
    assert entry["pricing"]["inputPerMillion"] == "3"
    assert entry["estimatedTokens"] == input_tokens + 400
    assert status["reserved"] == entry["amount"]
    assert status["activeBatches"] == 1
    (batch,) = batches(fake_gateway)
    annotations = batch["metadata"]["annotations"]
    assert annotations["llmbatch.io/estimated-tokens"] == str(input_tokens + 400)
    # acceptance reads the account whatever a recent read found (the account may be newer)
    assert annotations["llmbatch.io/credit-reserved"] == "true"


def test_not_enough_credit_is_402_and_nothing_is_created(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "0.001")
    resp = create(fake_gateway, key, upload(fake_gateway, key, jsonl(rows(4))))
    assert resp.status_code == 402, resp.text
    error = resp.json()["error"]
    assert error["code"] == "insufficient_credit"
    assert "0.001000 USD is available" in error["message"]
    assert batches(fake_gateway) == []
    assert account_status(fake_gateway) == {}


def test_a_tenant_without_an_account_is_not_limited(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    assert create(fake_gateway, key, upload(fake_gateway, key, jsonl(rows(4)))).status_code == 200


def test_a_concurrent_writer_makes_the_reservation_retry(
    fake_gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another replica reserves between our read and our write: our write is refused (409),
    the retry sees its reservation and keeps both."""
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    kube = fake_gateway.kube
    original = kube.replace_status
    raced: list[bool] = []

    async def racing(plural: str, namespace: str, name: str, body: dict[str, Any]) -> Any:
        if not raced:
            raced.append(True)
            other = {"batch": "batch-other", "amount": "0.5", "createdAt": 1}
            stored = kube.objects[(plural, namespace, name)]
            stored["status"] = {"reservations": [other], "reserved": "0.5"}
            stored["metadata"]["resourceVersion"] = "2"
        return await original(plural, namespace, name, body)

    monkeypatch.setattr(kube, "replace_status", racing)
    assert create(fake_gateway, key, upload(fake_gateway, key, jsonl(rows(4)))).status_code == 200
    names = [e["batch"] for e in account_status(fake_gateway)["reservations"]]
    assert names[0] == "batch-other"
    assert len(names) == 2


def test_a_failed_create_gives_the_reservation_back(
    fake_gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    file_id = upload(fake_gateway, key, jsonl(rows(2)))
    kube = fake_gateway.kube
    original = kube.create

    async def refuse_batches(plural: str, namespace: str, body: dict[str, Any]) -> Any:
        if plural == "batches":
            raise Conflict(body["metadata"]["name"])
        return await original(plural, namespace, body)

    monkeypatch.setattr(kube, "create", refuse_batches)
    assert create(fake_gateway, key, file_id).status_code == 409
    assert account_status(fake_gateway).get("reservations") is None
    assert account_status(fake_gateway)["reserved"] == "0.000000"


@pytest.mark.parametrize("idempotency", [{"Idempotency-Key": "k-1"}, {}], ids=["key", "no-key"])
def test_a_create_that_finds_its_name_taken_answers_with_that_batch(
    fake_gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch, idempotency: dict[str, str]
) -> None:
    """With an Idempotency-Key, two requests: A reserves, B finds the reservation and creates
    the Batch first. A's create then conflicts: the reservation is the hold of B's live batch
    and stays. Without a key the random name can only have been taken by the request's own
    earlier try (the client tries a create the API server answered 503 again, and the first
    was stored after all): the answer is that batch, once, listed at once."""
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    file_id = upload(fake_gateway, key, jsonl(rows(2)))
    kube = fake_gateway.kube
    original = kube.create

    async def other_request_wins(plural: str, namespace: str, body: dict[str, Any]) -> Any:
        if plural == "batches":
            await original(plural, namespace, body)  # request B's create, same name
            raise Conflict(body["metadata"]["name"])
        return await original(plural, namespace, body)

    monkeypatch.setattr(kube, "create", other_request_wins)
    resp = fake_gateway.client.post(
        "/v1/batches",
        headers={**auth(key), **idempotency},
        json={
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "input_file_id": file_id,
        },
    )
    assert resp.status_code == 200, resp.text  # the replay of B's batch
    (batch,) = batches(fake_gateway)
    batch_id = "batch_" + batch["metadata"]["name"].removeprefix("batch-")
    assert resp.json()["id"] == batch_id
    (entry,) = account_status(fake_gateway)["reservations"]
    assert entry["batch"] == batch["metadata"]["name"]
    assert account_status(fake_gateway)["reserved"] == entry["amount"]
    listed = fake_gateway.client.get("/v1/batches", headers=auth(key)).json()["data"]
    assert [b["id"] for b in listed] == [batch_id]


def test_a_create_that_may_have_succeeded_keeps_the_reservation(
    fake_gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timeout can hide a create the API server carried out: the reservation stays (the
    operator's upkeep drops it if the Batch never appears)."""
    key = fake_gateway.key(NS)
    add_pool(fake_gateway)
    add_account(fake_gateway, "1")
    file_id = upload(fake_gateway, key, jsonl(rows(2)))
    kube = fake_gateway.kube
    original = kube.create

    async def time_out(plural: str, namespace: str, body: dict[str, Any]) -> Any:
        if plural == "batches":
            await original(plural, namespace, body)
            raise TimeoutError("no answer from the API server")
        return await original(plural, namespace, body)

    monkeypatch.setattr(kube, "create", time_out)
    assert create(fake_gateway, key, file_id).status_code == 503
    (batch,) = batches(fake_gateway)
    (entry,) = account_status(fake_gateway)["reservations"]
    assert entry["batch"] == batch["metadata"]["name"]


# --- size caps and quotas ------------------------------------------------------------------------


def test_pool_request_cap_is_400_at_creation(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway, {"limits": {"maxRequests": 2}})
    resp = create(fake_gateway, key, upload(fake_gateway, key, jsonl(rows(3))))
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "too_many_requests"
    assert resp.json()["error"]["param"] == "input_file_id"
    assert "at most 2" in resp.json()["error"]["message"]


def test_private_pool_takes_at_most_95_inline_requests(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(fake_gateway, {"billing": {"mode": "GPUTime", "gpuHourPrice": "2"}})
    inline = rows(96)
    resp = create(fake_gateway, key, requests=inline)
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "requests"
    assert create(fake_gateway, key, requests=inline[:95]).status_code == 200


def test_tenant_token_quota_is_429_token_limit_exceeded(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("llama")
    key = fake_gateway.key(NS)
    data = jsonl(rows(2))
    tokens = -(-len(data) // 3) + 200
    fake_gateway.kube.namespaces[NS] = {"llmbatch.io/max-queued-tokens": str(tokens * 2 - 1)}
    file_id = upload(fake_gateway, key, data)
    assert create(fake_gateway, key, file_id).status_code == 200
    resp = create(fake_gateway, key, file_id)
    assert resp.status_code == 429
    error = resp.json()["error"]
    assert error["code"] == "token_limit_exceeded"
    assert error["type"] == "rate_limit_error"
    assert "Enqueued token limit" in error["message"]
    assert resp.headers["Retry-After"] == "60"


def test_pool_queue_limit_is_429_capacity_exceeded(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    add_pool(
        fake_gateway,
        {"limits": {"maxQueuedRequests": 10}},
        queueDepth={"expedited": 0, "standard": 7, "flex": 1},
    )
    file_id = upload(fake_gateway, key, jsonl(rows(3)))
    resp = create(fake_gateway, key, file_id)
    assert resp.status_code == 429
    assert resp.json()["error"]["code"] == "capacity_exceeded"
    assert "pool-a" in resp.json()["error"]["message"]
    assert create(fake_gateway, key, upload(fake_gateway, key, jsonl(rows(2)))).status_code == 200


def test_pure_checks() -> None:
    catalog = BatchPoolSpec.model_validate({"models": [{"name": "m", "source": "s"}]})
    private = BatchPoolSpec.model_validate(
        {"models": [{"name": "m", "source": "s"}], "billing": {"mode": "GPUTime"}}
    )
    assert admission.max_requests(catalog) == 1000
    assert admission.max_requests(private) == 95
    assert catalog.limits.max_bytes == 256 * 1024 * 1024
    assert admission.check_batch_size("p", catalog, 1000, 256 * 1024 * 1024, "f") is None
    refusal = admission.check_batch_size("p", catalog, 1, 256 * 1024 * 1024 + 1, "f")
    assert refusal is not None
    assert refusal.code == "file_too_large"
    quota = admission.check_tenant_queue(
        queued_requests=5,
        queued_tokens=0,
        requests=1,
        tokens=1,
        max_queued_requests=5,
        max_queued_tokens=None,
    )
    assert quota is not None
    assert quota.code == "queue_full"
    pools = [
        {"metadata": {"name": "a"}, "spec": {"models": [{"name": "x"}]}},
        {"metadata": {"name": "b"}, "spec": {"models": [{"name": "m"}]}},
        {"metadata": {"name": "c"}, "spec": {"models": [{"name": "m"}]}},
    ]
    chosen = admission.choose_pool(pools, "m")
    assert chosen is not None
    assert chosen["metadata"]["name"] == "b"
    assert admission.choose_pool(pools, "missing") is None


def test_a_pool_spec_the_models_reject_is_left_out_of_the_catalog() -> None:
    from llmbatch.core.tenancy import Tenant
    from llmbatch.gateway.routes.models import model_catalog

    good = {"metadata": {"name": "a"}, "spec": {"models": [{"name": "m1", "source": "/m"}]}}
    bad = {
        "metadata": {"name": "b"},
        "spec": {"models": [{"name": "m2", "source": "/m"}], "maxSlots": 0},
    }
    ids = [entry["id"] for entry in model_catalog([good, bad], Tenant(NS))]
    assert ids == ["m1"]
