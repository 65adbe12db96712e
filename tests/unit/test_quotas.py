"""A tenant's limits at the gateway: each API key's request rate (429 ``rate_limit_exceeded``
with ``Retry-After``), the tenant's unfinished batches (429 ``too_many_batches``) and its stored
file bytes (400 ``storage_quota_exceeded``), each a default the namespace may override — and
the same batch cap at the operator, the only check a kubectl Batch meets. The pure rules
(``core.ratelimit``, ``core.quotas``) first."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

from llmbatch.core.quotas import (
    NAMESPACE_MAX_STORED_BYTES,
    NAMESPACE_MAX_WAITING_BATCHES,
    TenantCaps,
    check_waiting_batches,
    storage_room,
)
from llmbatch.core.ratelimit import KeyRateLimiter, TokenBucket, retry_after_header
from llmbatch.gateway.listcache import batch_entry, file_entry
from llmbatch.gateway.listindex import ListIndex
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.gateway import FakeGateway, auth, fake_gateway_with
from tests.fixtures.reconciler import ReconcilerHarness

NS = "team-q"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the pure rules -------------------------------------------------------------------------


def test_a_bucket_gives_its_burst_then_its_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, tokens=3, updated=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [None, None, None]
    assert bucket.take(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) is None
    assert bucket.take(0.5) == pytest.approx(0.5)
    assert [bucket.take(10.0) for _ in range(4)][-1] is not None  # never more than the burst


def test_keys_have_buckets_of_their_own_and_idle_ones_are_forgotten() -> None:
    clock = Clock()
    limiter = KeyRateLimiter(rate=1, burst=2, clock=clock)
    assert [limiter.admit("a") for _ in range(3)] == [None, None, pytest.approx(1.0)]
    assert limiter.admit("b") is None
    clock.now += 5000
    for i in range(2000):
        limiter.admit(f"k{i}")
    assert "a" not in limiter._buckets  # full again long ago: forgotten
    assert KeyRateLimiter(rate=0, burst=1).admit("a") is None  # 0: no limit


def test_retry_after_is_whole_seconds_never_zero() -> None:
    assert [retry_after_header(s) for s in (0.01, 1.0, 1.2)] == ["1", "1", "2"]


def test_a_namespace_sets_its_own_caps_over_the_defaults() -> None:
    default = TenantCaps.defaults(1000, 0)
    assert default == TenantCaps(1000, None)
    own = TenantCaps.of(
        {NAMESPACE_MAX_WAITING_BATCHES: "0", NAMESPACE_MAX_STORED_BYTES: "5"}, default
    )
    assert own == TenantCaps(0, 5)
    assert TenantCaps.of({NAMESPACE_MAX_WAITING_BATCHES: "many"}, default) == default
    assert check_waiting_batches(999, 1000) is None
    refused = check_waiting_batches(1000, 1000)
    assert refused is not None
    assert refused.code == "too_many_batches"
    assert storage_room(10, None) is None
    assert storage_room(10, 4) == 0


def test_the_listing_index_keeps_each_tenants_totals() -> None:
    index = ListIndex()

    def batch(name: str, phase: str | None) -> dict[str, Any]:
        obj = make_batch(name, namespace=NS)
        obj["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
        obj["status"] = {"status": phase} if phase else {}
        return obj

    for name, phase in [("a", None), ("b", "in_progress"), ("c", "completed")]:
        entry = batch_entry(batch(f"batch-{name * 24}", phase))
        assert entry is not None
        index.put(NS, entry)
    assert index.total(NS) == 2
    done = batch_entry(batch("batch-" + "a" * 24, "failed"))
    assert done is not None
    index.put(NS, done)
    assert index.total(NS) == 1
    index.remove(NS, "batch_" + "b" * 24)
    assert index.total(NS) == 0
    files = ListIndex()
    spec = make_input_file_spec(700)
    entry = file_entry(spec)
    assert entry is not None
    files.put(NS, entry)
    files.replace([(NS, entry), ("other", entry)])
    assert (files.total(NS), files.total("other"), files.total("nobody")) == (700, 700, 0)


def make_input_file_spec(size: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "file-" + "1" * 32, "namespace": NS},
        "spec": {"id": "file-" + "1" * 32, "bytes": size, "filename": "x.jsonl",
                 "purpose": "batch", "createdAt": 1_800_000_000},
    }  # fmt: skip


# --- through the gateway ----------------------------------------------------------------------


def rows(n: int) -> bytes:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    line = {"method": "POST", "url": "/v1/chat/completions", "body": body}
    return b"".join(json.dumps({"custom_id": f"r{i}", **line}).encode() + b"\n" for i in range(n))


def upload(gw: FakeGateway, key: str, data: bytes) -> Any:
    return gw.client.post(
        "/v1/files", headers=auth(key), files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}
    )


def create(gw: FakeGateway, key: str, file_id: str) -> Any:
    body = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
    body["input_file_id"] = file_id
    return gw.client.post("/v1/batches", headers=auth(key), json=body)


def test_a_key_over_its_rate_gets_429_with_retry_after(tmp_path: pathlib.Path) -> None:
    with fake_gateway_with(tmp_path, rate_limit=2, rate_burst=3) as gw:
        clock = Clock()
        gw.client.app.state.gateway.limiter.clock = clock  # type: ignore[attr-defined]
        key, other = gw.key(NS), gw.key(NS)
        clock.now += 10  # the keys' checks above spent their buckets' tokens: full again
        answers = [gw.client.get("/v1/batches", headers=auth(key)) for _ in range(4)]
        assert [a.status_code for a in answers] == [200, 200, 200, 429]
        refused = answers[-1]
        assert refused.headers["retry-after"] == "1"
        assert refused.json() == {
            "error": {
                "message": refused.json()["error"]["message"],
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
        assert "Please try again in 1s" in refused.json()["error"]["message"]
        assert gw.client.get("/v1/batches", headers=auth(other)).status_code == 200
        clock.now += 0.5  # one token back
        assert gw.client.get("/v1/batches", headers=auth(key)).status_code == 200
        assert gw.client.get("/v1/batches", headers=auth(key)).status_code == 429


def test_a_tenant_at_its_cap_of_unfinished_batches_gets_429(tmp_path: pathlib.Path) -> None:
    with fake_gateway_with(tmp_path, max_waiting_batches=3) as gw:
        gw.serve("m")
        key = gw.key(NS)
        gw.kube.namespaces[NS] = {NAMESPACE_MAX_WAITING_BATCHES: "2"}  # over the default 3
        file_id = upload(gw, key, rows(2)).json()["id"]
        assert [create(gw, key, file_id).status_code for _ in range(2)] == [200, 200]
        refused = create(gw, key, file_id)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "60"
        assert refused.json()["error"]["code"] == "too_many_batches"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert "limit for your organization is 2" in refused.json()["error"]["message"]
        # one finishes: room for one more
        (name, obj) = next(((k[2], o) for k, o in gw.kube.objects.items() if k[0] == "batches"))
        obj["status"] = {"status": "completed"}
        gw.kube.changed("batches", "MODIFIED", obj)
        wait = gw.client.app.state.gateway.lists.batches  # type: ignore[attr-defined]
        assert _eventually(lambda: wait.index.total(NS) == 1), name
        assert create(gw, key, file_id).status_code == 200
        # the default cap where the namespace sets none
        other = gw.key("team-r")
        other_file = upload(gw, other, rows(1)).json()["id"]
        codes = [create(gw, other, other_file).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]


def test_an_upload_past_the_tenants_storage_cap_gets_400(tmp_path: pathlib.Path) -> None:
    with fake_gateway_with(tmp_path) as gw:
        gw.serve("m")
        key = gw.key(NS)
        first = rows(3)
        gw.kube.namespaces[NS] = {NAMESPACE_MAX_STORED_BYTES: str(len(first) * 2)}
        assert upload(gw, key, first).status_code == 200
        refused = upload(gw, key, rows(4))  # past what is left
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("storage_quota_exceeded", "file")
        assert upload(gw, key, first).status_code == 200  # exactly fills it
        full = upload(gw, key, rows(1))
        assert full.status_code == 400
        assert full.json()["error"]["code"] == "storage_quota_exceeded"
        files = gw.client.get("/v1/files", headers=auth(key)).json()["data"]
        assert len(files) == 2  # nothing was stored of the refused uploads
        gw.client.delete(f"/v1/files/{files[0]['id']}", headers=auth(key))
        assert upload(gw, key, rows(1)).status_code == 200


def _eventually(check: Any, seconds: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.01)
    return False


# --- at the operator: a kubectl Batch past the cap ----------------------------------------------


def test_a_kubectl_batch_past_the_tenants_cap_fails_validation(tmp_path: pathlib.Path) -> None:
    h = ReconcilerHarness(tmp_path, max_waiting_batches=2)
    h.kube.add("batchpools", make_pool())
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "e" * 32, 2))
    names = [f"batch-{i:024x}" for i in range(3)]
    for name in names:
        h.kube.add("batches", make_batch(name, input_file_id="file-" + "e" * 32))
    for name in names:
        h.step_until(name, "in_progress", "failed")
    assert [h.status(n)["status"] for n in names] == ["in_progress", "in_progress", "failed"]
    (problem,) = h.status(names[2])["errors"]
    assert problem["code"] == "too_many_batches"
    h.kube.namespaces[TENANT] = {NAMESPACE_MAX_WAITING_BATCHES: "3"}  # the tenant's own cap
    again = copy.deepcopy(make_batch("batch-" + "f" * 24, input_file_id="file-" + "e" * 32))
    h.kube.add("batches", again)
    assert h.step_until("batch-" + "f" * 24, "in_progress", "failed")["status"] == "in_progress"
