"""Credits and quotas on the real control plane, through the official ``openai`` SDK.

A gateway sharing the operator's store (so the operator runs what the gateway accepts), the
operator and shard pods on the simulated engine. Each test makes its own pool serving a model
of its own, so the gateway's pool choice is never another test's pool.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from llmbatch.core.billing import estimate_input_tokens
from llmbatch.core.ids import batch_object_name
from llmbatch.core.keys import shard_prefix
from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
from llmbatch.storage import FilesystemStore
from llmbatch.storage.shardresults import read_progress
from tests.fixtures.gateway import GatewayProcess, wait_for_key
from tests.fixtures.operator import ClusterCLI, OperatorProcess, simulated_pool
from tests.integration.test_operator import (
    _POOLS,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    get_batch,
    read_lines,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
CHAT = "/v1/chat/completions"
SLOW = ["--latency-seconds=2", "--max-num-seqs=1"]


Tenant = tuple[str, openai.OpenAI]


@pytest.fixture
def tenants(gateway: GatewayProcess) -> Iterator[Callable[..., Tenant]]:
    """``make(annotations=None, credit=None)`` → (namespace, SDK client); credit makes an
    account with that limit."""
    made: list[str] = []

    def make(annotations: dict[str, str] | None = None, credit: str | None = None) -> Tenant:
        namespace = f"credit-{uuid.uuid4().hex[:8]}"
        gateway.kubectl(
            "apply",
            "-f",
            "-",
            obj={
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": namespace, "annotations": annotations or {}},
            },
        )
        made.append(namespace)
        if credit is not None:
            gateway.kubectl(
                "apply",
                "-f",
                "-",
                obj={
                    "apiVersion": "llmbatch.io/v1alpha1",
                    "kind": "CreditAccount",
                    "metadata": {"name": "default", "namespace": namespace},
                    "spec": {"limit": credit},
                },
            )
        key = new_api_key()
        secret = key_secret(
            f"key-{namespace}",
            hash_key(key),
            namespace,
            ["inference:write", "inference:read"],
            gateway.gateway_namespace,
        )
        gateway.kubectl("apply", "-f", "-", obj=secret)
        wait_for_key(gateway.base_url, key, accepted=True)
        client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
        return namespace, client

    yield make
    for namespace in made:
        gateway.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def make_pool(
    cluster: ClusterCLI,
    tmp_path: pathlib.Path,
    *,
    engine_args: list[str],
    limits: dict[str, Any] | None = None,
    shard_requests: int = 50,
    executor: dict[str, Any] | None = None,
    **spec: Any,
) -> tuple[str, str]:
    """A one-slot simulated pool for a model of its own: ``(pool name, model)``.

    Standard-tier prices are high on purpose (1,000 / 2,000 per 1M tokens) so a handful of
    requests costs whole cents.
    """
    name = f"pool-{uuid.uuid4().hex[:8]}"
    model = f"credit-model-{uuid.uuid4().hex[:6]}"
    _POOLS.append(name)
    pool = simulated_pool(
        name,
        model,
        maxSlots=1,
        shardRequests=shard_requests,
        throughputPerSlot="10",
        limits=limits or {},
        tiers={
            "standard": {
                "drainTargetSeconds": 3600,
                "pricing": {"inputPerMillion": "1000", "outputPerMillion": "2000"},
            }
        },
        executor={"engineArgs": engine_args, "flushLines": 1, **(executor or {})},
        **spec,
    )
    apply(cluster, tmp_path, pool)
    return name, model


def jsonl(model: str, n: int, max_tokens: int = 8) -> bytes:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Summarize ticket {i}."}],
                "max_tokens": max_tokens,
            },
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def create(client: openai.OpenAI, data: bytes) -> Any:
    uploaded = client.files.create(file=("requests.jsonl", data), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")


def account(cluster: ClusterCLI, namespace: str) -> dict[str, Any]:
    out = cluster.kubectl("get", "creditaccount", "default", "-n", namespace, "-o", "json")
    result: dict[str, Any] = json.loads(out)
    return result


def estimate_of(data: bytes, requests: int, max_tokens: int = 8) -> Decimal:
    """What the gateway reserves for ``data`` on a pool of ``make_pool``."""
    tokens_in = estimate_input_tokens(len(data))
    return (Decimal(tokens_in) * 1000 + Decimal(requests * max_tokens) * 2000) / 1_000_000


# --- tests -------------------------------------------------------------------------------------


def test_two_concurrent_creations_over_the_credit_get_exactly_one_402(
    cluster: ClusterCLI,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    _, model = make_pool(cluster, tmp_path, engine_args=SLOW)
    data = jsonl(model, 5)
    each = estimate_of(data, 5)
    namespace, client = tenants(credit=str(each * Decimal("1.5")))
    files = [client.files.create(file=("r.jsonl", data), purpose="batch").id for _ in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[Any] = [None, None]

    def submit(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = client.batches.create(
                input_file_id=files[i], endpoint=CHAT, completion_window="24h"
            )
        except openai.APIStatusError as exc:
            outcomes[i] = exc

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    refused = [o for o in outcomes if isinstance(o, openai.APIStatusError)]
    created = [o for o in outcomes if not isinstance(o, openai.APIStatusError)]
    assert len(refused) == 1, outcomes
    assert len(created) == 1, outcomes
    assert refused[0].status_code == 402
    assert refused[0].code == "insufficient_credit"
    assert "available" in refused[0].message
    # nothing was created for the refused one; the account holds exactly one reservation
    batches = json.loads(cluster.kubectl("get", "batches", "-n", namespace, "-o", "json"))
    assert [b["metadata"]["name"] for b in batches["items"]] == [batch_object_name(created[0].id)]
    status = account(cluster, namespace)["status"]
    assert status["activeBatches"] == 1
    assert Decimal(status["reserved"]) == each
    assert Decimal(status["available"]) == each / 2
    # kubectl shows the tenant's credit
    table = cluster.kubectl("get", "creditaccounts", "-n", namespace)
    assert table.split()[:6] == ["NAME", "LIMIT", "RESERVED", "CHARGED", "AVAILABLE", "BATCHES"]


def test_cancelled_batch_charges_only_its_completed_requests(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    # one request of the batch fails on the model side: it is not charged either
    _, model = make_pool(
        cluster,
        tmp_path,
        engine_args=["--latency-seconds=1", "--max-num-seqs=1", "--fail-pattern=^req-1$"],
    )
    namespace, client = tenants(credit="100")
    data = jsonl(model, 30)
    batch = create(client, data)
    name = batch_object_name(batch.id)
    reserved = Decimal(account(cluster, namespace)["status"]["reserved"])
    assert reserved == estimate_of(data, 30)

    def some_done() -> bool:
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get("requestCounts")
        return bool(counts and counts["completed"] >= 3)

    wait_for(some_done, 120, "first results", operator_process.logs)
    assert client.batches.cancel(batch.id).status == "cancelling"
    final = wait_status(cluster, operator_process, namespace, name, {"cancelled"})["status"]
    outputs = read_lines(operator_process, namespace, final["outputFileID"])
    errors = read_lines(operator_process, namespace, final["errorFileID"])
    assert 3 <= len(outputs) < 30
    (failed,) = [e for e in errors if e["response"]]
    assert failed["response"]["status_code"] == 500
    # a 500 is retried (the pool's default: 3 attempts); the line says so
    assert "failed after 3 attempts" in failed["response"]["body"]["error"]["message"]
    input_tokens = sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in outputs)
    output_tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in outputs)
    cost = (Decimal(input_tokens) * 1000 + Decimal(output_tokens) * 2000) / 1_000_000
    assert Decimal(final["cost"]) == cost
    assert cost < reserved
    assert final["billing"]["settledAt"] >= final["cancelledAt"] - 1
    status = account(cluster, namespace)["status"]
    assert Decimal(status["charged"]) == cost
    assert Decimal(status["reserved"]) == 0
    assert status["activeBatches"] == 0
    assert Decimal(status["available"]) == 100 - cost
    # the SDK sees the same batch (after the gateway's 1 s read cache); the charge is counted
    wait_for(lambda: client.batches.retrieve(batch.id).status == "cancelled", 10, "SDK view")
    assert "llmbatch_credits_charged_total" in operator_process.metrics()


def _tokens_cost(outputs: list[dict[str, Any]]) -> Decimal:
    """What the output lines cost on a pool of ``make_pool`` (each line once)."""
    input_tokens = sum(o["response"]["body"]["usage"]["prompt_tokens"] for o in outputs)
    output_tokens = sum(o["response"]["body"]["usage"]["completion_tokens"] for o in outputs)
    return (Decimal(input_tokens) * 1000 + Decimal(output_tokens) * 2000) / 1_000_000


def test_transient_engine_errors_are_retried_and_billed_once(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    # seed 002: "Failed requests are retried. You are billed once per completed request."
    # Two requests get a 503 from the engine twice, then an answer (a flaky, overloaded engine)
    flaky = ["--latency-seconds=0.05", "--fail-pattern=^req-[12]$", "--fail-status=503"]
    _, model = make_pool(
        cluster,
        tmp_path,
        engine_args=[*flaky, "--fail-attempts=2"],
        retries={"maxAttempts": 3, "backoffMilliseconds": 200},
    )
    namespace, client = tenants(credit="100")
    batch = create(client, jsonl(model, 6))
    name = batch_object_name(batch.id)
    final = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    assert final["requestCounts"] == {"total": 6, "completed": 6, "failed": 0}
    assert not final.get("errorFileID")
    outputs = read_lines(operator_process, namespace, final["outputFileID"])
    assert sorted(o["custom_id"] for o in outputs) == [f"req-{i}" for i in range(6)]
    assert Decimal(final["cost"]) == _tokens_cost(outputs)
    assert Decimal(account(cluster, namespace)["status"]["charged"]) == _tokens_cost(outputs)


@pytest.mark.parametrize("billing", ["Tokens", "GPUTime"])
def test_cancel_lets_the_requests_in_the_engine_finish_and_bills_them(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
    billing: str,
) -> None:
    # seed 002: "Cancel requested. Running requests finish." Requests take 4 s, four at a time
    # (2 x max_num_seqs in flight); any other take-back drains 1 s (terminationGraceSeconds 6),
    # which cut these four to batch_cancelled before
    _, model = make_pool(
        cluster,
        tmp_path,
        engine_args=["--latency-seconds=4", "--max-num-seqs=2"],
        executor={"terminationGraceSeconds": 6},
        billing={"mode": billing, "gpuHourPrice": "36"},
    )
    namespace, client = tenants(credit="100")
    batch = create(client, jsonl(model, 20))
    name = batch_object_name(batch.id)
    store = FilesystemStore(operator_process.store_root)
    prefix = shard_prefix(namespace, get_batch(cluster, namespace, name)["metadata"]["uid"], 0)
    deadline = time.monotonic() + 120
    while (progress := read_progress(store, prefix)) is None or progress.completed < 4:
        assert time.monotonic() < deadline, operator_process.logs()[-3000:]
        time.sleep(0.05)  # cancel at once: the next four have just entered the engine
    assert client.batches.cancel(batch.id).status == "cancelling"
    asked = time.monotonic()
    final = wait_status(cluster, operator_process, namespace, name, {"cancelled"})["status"]
    outputs = read_lines(operator_process, namespace, final["outputFileID"])
    errors = read_lines(operator_process, namespace, final["errorFileID"])
    # the first four, and the four that were in the engine when the cancel came; nothing more
    assert len(outputs) == 8, (len(outputs), operator_process.logs()[-3000:])
    assert len(errors) == 12
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert final["requestCounts"] == {"total": 20, "completed": 8, "failed": 12}
    assert time.monotonic() - asked < 60
    charged = Decimal(account(cluster, namespace)["status"]["charged"])
    assert Decimal(final["cost"]) == charged
    if billing == "Tokens":  # the finished ones are billed, each once
        assert charged == _tokens_cost(outputs)
        return
    # GPU time: 8 committed requests, each a quarter of the engine for 4 s (8 s); the work of
    # the cut-off ones before, had they been cut, was not (before: the run's whole share)
    gpu_seconds = final["billing"]["gpuSeconds"]
    assert 8 <= gpu_seconds <= 10, final["shards"]
    assert charged == Decimal(gpu_seconds) * 36 / 3600


def test_429_for_a_full_pool_queue_and_for_the_tenant_token_quota(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    pool, model = make_pool(cluster, tmp_path, engine_args=SLOW, limits={"maxQueuedRequests": 12})
    namespace, client = tenants()
    first = create(client, jsonl(model, 10))  # holds the slot for ~20 s

    def queued() -> int:
        out = cluster.kubectl(
            "get", "batchpool", pool, "-o", "jsonpath={.status.queueDepth.standard}"
        )
        return int(out or 0)

    wait_for(lambda: queued() == 10, 60, "the pool's backlog", operator_process.logs)

    # the pool's queue: 10 queued + 3 > 12 is refused by any tenant, 10 + 2 is not
    _, other = tenants()
    with pytest.raises(openai.RateLimitError) as full:
        create(other, jsonl(model, 3))
    assert full.value.status_code == 429
    assert full.value.code == "capacity_exceeded"
    assert pool in full.value.message
    assert create(other, jsonl(model, 2)).status == "validating"

    # the tenant's queued-token quota: what the first batch holds, plus one token
    held = int(
        get_batch(cluster, namespace, batch_object_name(first.id))["metadata"]["annotations"][
            "llmbatch.io/estimated-tokens"
        ]
    )
    cluster.kubectl("annotate", "namespace", namespace, f"llmbatch.io/max-queued-tokens={held + 1}")
    with pytest.raises(openai.RateLimitError) as quota:
        create(client, jsonl(model, 1))
    assert quota.value.code == "token_limit_exceeded"
    assert "Enqueued token limit reached" in quota.value.message
    assert f"limit for your organization is {held + 1}" in quota.value.message
    for owner in (client, other):  # free the slot for the next test
        for batch in owner.batches.list().data:
            if batch.status not in ("completed", "failed", "cancelled", "expired"):
                owner.batches.cancel(batch.id)


def test_kubectl_batch_without_enough_credit_fails_clearly(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    _, model = make_pool(cluster, tmp_path, engine_args=["--latency-seconds=0.01"])
    namespace, _ = tenants(credit="0.01")
    requests = [
        {
            "customID": f"req-{i}",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
        }
        for i in range(3)
    ]
    name = f"batch-{uuid.uuid4().hex[:24]}"
    apply(
        cluster,
        tmp_path,
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "Batch",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"endpoint": CHAT, "requests": requests},
        },
    )
    status = wait_status(cluster, operator_process, namespace, name, {"failed"})["status"]
    assert status["errors"][0]["code"] == "insufficient_credit"
    assert "Add credit" in status["errors"][0]["message"]
    credit = account(cluster, namespace).get("status") or {}
    assert Decimal(credit.get("charged", "0")) == 0
    assert not credit.get("reservations")


def test_private_pool_charges_gpu_time_not_tokens(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    pool, model = make_pool(
        cluster, tmp_path, engine_args=["--latency-seconds=1", "--max-num-seqs=1"]
    )
    cluster.kubectl(
        "patch",
        "batchpool",
        pool,
        "--type=merge",
        "-p",
        '{"spec":{"gpusPerSlot":2,"billing":{"mode":"GPUTime","gpuHourPrice":"36"}}}',
    )
    namespace, client = tenants(credit="100")
    batch = create(client, jsonl(model, 4))
    entry = account(cluster, namespace)["status"]["reservations"][0]
    assert entry["mode"] == "GPUTime"
    assert entry["gpuHourPrice"] == "36"
    name = batch_object_name(batch.id)
    final = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    gpu_seconds = final["billing"]["gpuSeconds"]
    run_seconds = sum(s["runSeconds"] for s in final["shards"])
    # the shards' busy shares summed, times 2 GPUs, rounded up once for the batch; each shard's
    # runSeconds is its share rounded up (shown per shard)
    shards = len(final["shards"])
    assert 2 * (run_seconds - shards) < gpu_seconds <= 2 * run_seconds
    assert run_seconds >= 2  # four requests of one second each, at most two in flight
    assert Decimal(final["cost"]) == Decimal(gpu_seconds) * 36 / 3600
    assert final["pricing"]["inputPerMillion"] == "0"  # no separate token charge
    status = account(cluster, namespace)["status"]
    assert Decimal(status["charged"]) == Decimal(final["cost"])
    assert status["activeBatches"] == 0


def test_a_pod_waiting_for_a_node_is_not_charged_gpu_time(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],
    tmp_path: pathlib.Path,
) -> None:
    """Seed 000: queue time has no GPU charge. A private pool whose nodeSelector matches no
    node: a slot Job starts for the batch's shard but its pod never schedules; cancelled after
    waiting, the batch is charged 0 GPU-seconds."""
    pool, model = make_pool(cluster, tmp_path, engine_args=["--latency-seconds=0.01"])
    patch = {
        "spec": {
            "billing": {"mode": "GPUTime", "gpuHourPrice": "36"},
            "nodeSelector": {"llmbatch.io/no-such-node": "true"},
        }
    }
    cluster.kubectl("patch", "batchpool", pool, "--type=merge", "-p", json.dumps(patch))
    namespace, client = tenants(credit="100")
    batch = create(client, jsonl(model, 2))
    name = batch_object_name(batch.id)

    def pending_pod() -> Any:
        pods = json.loads(
            cluster.kubectl(
                "get",
                "pods",
                "-n",
                "llmbatch-workers",
                "-l",
                f"llmbatch.io/pool={pool}",
                "-o",
                "json",
            )
        )["items"]
        unscheduled = [
            p
            for p in pods
            for c in (p.get("status") or {}).get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]
        return unscheduled

    wait_for(pending_pod, 60, "the slot pod, unschedulable")
    # the slot Job is running (startTime set) while its pod waits: before #16 this wait was
    # billed from the Job's startTime
    jobs = json.loads(
        cluster.kubectl(
            "get", "jobs", "-n", "llmbatch-workers", "-l", f"llmbatch.io/pool={pool}", "-o", "json"
        )
    )["items"]
    assert jobs
    assert all((j.get("status") or {}).get("startTime") for j in jobs)
    time.sleep(5)
    status = get_batch(cluster, namespace, name)["status"]
    assert status["status"] == "in_progress"
    assert all(s.get("runSeconds", 0) == 0 for s in status["shards"]), status["shards"]
    client.batches.cancel(batch.id)
    final = wait_status(cluster, operator_process, namespace, name, {"cancelled"})["status"]
    assert final["billing"]["gpuSeconds"] == 0
    assert sum(s.get("runSeconds", 0) for s in final["shards"]) == 0
    assert Decimal(final["cost"]) == 0
    assert Decimal(account(cluster, namespace)["status"]["charged"]) == 0
