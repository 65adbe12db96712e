"""The operator on the real control plane: lifecycle, bad input, cancel, expiry, faults.

Real parts only: the control plane and node agent (pods are local processes running
``python -m llmbatch.executor``), the operator as its own process, a filesystem store. The
executor uses the simulated engine here (fast, deterministic); the vLLM engine is exercised by
the executor and end-to-end tests.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psutil
import pytest
from openai.types.chat import ChatCompletion

from llmbatch.core.ids import batch_id_from_name, batch_request_id
from llmbatch.core.keys import file_key, inline_staging_key
from llmbatch.storage import FilesystemStore
from tests.fixtures.operator import ROOT, WORKER_NAMESPACE, OperatorProcess, simulated_pool

pytestmark = pytest.mark.timeout(600)
MODEL = "sim-model"


# --- helpers -----------------------------------------------------------------------------------

_POOLS: list[str] = []


@pytest.fixture(autouse=True)
def _delete_pools(cluster: Any) -> Iterator[None]:
    """Each test's pools go with it (every pool runs a scheduler timer in the operator)."""
    yield
    while _POOLS:
        cluster.kubectl("delete", "batchpool", _POOLS.pop(), "--wait=false", check=False)


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json")
    return json.loads(out)


def apply(cluster: Any, tmp_path: pathlib.Path, obj: dict[str, Any]) -> None:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(obj))
    cluster.kubectl("apply", "-f", str(path))


def make_pool(
    cluster: Any,
    tmp_path: pathlib.Path,
    *,
    max_slots: int = 2,
    shard_requests: int = 10,
    engine_args: list[str] | None = None,
    backoff_limit: int = 3,
    limits: dict[str, Any] | None = None,
    throughput: str = "100",
) -> str:
    name = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(name)
    pool = simulated_pool(
        name,
        MODEL,
        maxSlots=max_slots,
        shardRequests=shard_requests,
        throughputPerSlot=throughput,
        limits=limits or {},
        executor={
            "engineArgs": engine_args or ["--latency-seconds=0.01"],
            "backoffLimit": backoff_limit,
        },
    )
    apply(cluster, tmp_path, pool)
    return name


def chat_requests(n: int, prefix: str = "req") -> list[dict[str, Any]]:
    return [
        {
            "customID": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Summarize ticket {i}."}],
                "max_tokens": 8,
            },
        }
        for i in range(n)
    ]


def make_batch(
    cluster: Any,
    tmp_path: pathlib.Path,
    namespace: str,
    *,
    pool: str,
    requests: list[dict[str, Any]] | None = None,
    input_file_id: str | None = None,
    inline_input: Callable[[str], dict[str, Any]] | None = None,
    window: str = "24h",
    model_hint: str | None = None,
    priority: str | None = None,
    metadata: dict[str, str] | None = None,
) -> str:
    name = f"batch-{uuid.uuid4().hex[:24]}"
    spec: dict[str, Any] = {
        "endpoint": "/v1/chat/completions",
        "completionWindow": window,
        "pool": pool,
    }
    if requests is not None:
        spec["requests"] = requests
    if input_file_id is not None:
        spec["inputFileID"] = input_file_id
    if inline_input is not None:  # given the Batch's name, as the gateway stages them
        spec["inlineInput"] = inline_input(name)
    if model_hint:
        spec["model"] = model_hint
    if priority:
        spec["priority"] = priority
    if metadata:
        spec["metadata"] = metadata
    apply(cluster, tmp_path, batch_manifest(namespace, spec, name))
    return name


def batch_manifest(namespace: str, spec: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """A Batch manifest (a fresh ``batch-`` name unless given) with ``spec`` as it is."""
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": name or f"batch-{uuid.uuid4().hex[:24]}", "namespace": namespace},
        "spec": spec,
    }


def batch_file(namespace: str, file_id: str, size: int, storage_key: str) -> dict[str, Any]:
    """A BatchFile manifest for an input whose bytes the test put in the store itself."""
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchFile",
        "metadata": {"name": file_id, "namespace": namespace},
        "spec": {
            "id": file_id,
            "bytes": size,
            "filename": "input.jsonl",
            "purpose": "batch",
            "storageKey": storage_key,
            "createdAt": int(time.time()),
        },
    }


def get_batch(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl_json(cluster, "get", "batch", name, "-n", namespace)
    return result


def wait_for(
    check: Callable[[], Any], timeout: float, what: str, on_fail: Callable[[], str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    detail = on_fail() if on_fail else ""
    pytest.fail(f"timed out after {timeout}s waiting for {what}; last={last!r}\n{detail[-8000:]}")


def wait_status(
    cluster: Any,
    operator: OperatorProcess,
    namespace: str,
    name: str,
    wanted: set[str],
    timeout: float = 180,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        batch = get_batch(cluster, namespace, name)
        return batch if (batch.get("status") or {}).get("status") in wanted else None

    def explain() -> str:
        batch = get_batch(cluster, namespace, name)
        jobs = cluster.kubectl(
            "get", "jobs,pods", "-n", WORKER_NAMESPACE, "-o", "wide", check=False
        )
        return f"status={json.dumps(batch.get('status'), indent=1)}\n{jobs}\n{operator.logs()}"

    result: dict[str, Any] = wait_for(check, timeout, f"batch {name} in {wanted}", explain)
    return result


def store_of(operator: OperatorProcess) -> FilesystemStore:
    return FilesystemStore(operator.store_root)


def read_lines(operator: OperatorProcess, namespace: str, file_id: str | None) -> list[Any]:
    if file_id is None:
        return []
    data = store_of(operator).get(file_key(namespace, file_id))
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def batch_uid(cluster: Any, namespace: str, name: str) -> str:
    uid: str = wait_for(
        lambda: (get_batch(cluster, namespace, name).get("metadata") or {}).get("uid"), 30, "uid"
    )
    return uid


def pool_slots(cluster: Any, pool: str) -> list[dict[str, Any]]:
    """The pool's slot Jobs (``kubectl get jobs -l llmbatch.io/pool=NAME``)."""
    items: list[dict[str, Any]] = kubectl_json(
        cluster, "get", "jobs", "-n", WORKER_NAMESPACE, "-l", f"llmbatch.io/pool={pool}"
    )["items"]
    return items


def assert_accounted(status: dict[str, Any], outputs: list[Any], errors: list[Any]) -> None:
    counts = status["requestCounts"]
    assert counts["completed"] == len(outputs)
    assert counts["failed"] == len(errors)
    assert counts["completed"] + counts["failed"] == counts["total"]
    ids = [line["custom_id"] for line in outputs + errors]
    assert len(ids) == len(set(ids)), "a request has two result lines"


# --- tests -------------------------------------------------------------------------------------


def test_happy_path_two_shards(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path, shard_requests=10)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(20))
    batch = wait_status(cluster, operator_process, namespace, name, {"completed", "failed"})
    status = batch["status"]
    assert status["status"] == "completed", status
    assert len(status["shards"]) == 2
    assert status["model"] == MODEL
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert status.get("errorFileID") is None
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(20))
    assert_accounted(status, outputs, [])
    uid = batch["metadata"]["uid"]
    for line in outputs:
        assert line["id"] == batch_request_id(uid, line["custom_id"])
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        ChatCompletion.model_validate(line["response"]["body"])
    usage = status["usage"]
    assert usage["inputTokens"] == sum(
        line["response"]["body"]["usage"]["prompt_tokens"] for line in outputs
    )
    assert usage["outputTokens"] == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in outputs
    )
    assert usage["totalTokens"] == usage["inputTokens"] + usage["outputTokens"]
    stamps = [status[k] for k in ("createdAt", "inProgressAt", "finalizingAt", "completedAt")]
    assert stamps == sorted(stamps)
    assert status["expiresAt"] == status["createdAt"] + 86400
    files = kubectl_json(cluster, "get", "batchfiles", "-n", namespace)["items"]
    output_file = next(f for f in files if f["metadata"]["name"] == status["outputFileID"])
    assert output_file["spec"]["purpose"] == "batch_output"
    assert output_file["spec"]["lineCount"] == 20
    assert output_file["metadata"]["ownerReferences"][0]["uid"] == uid
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )
    assert "Validated" in events
    assert "Completed" in events
    # one warm slot ran both shards (slotConcurrency from max_num_seqs); it stays up, idle
    (slot,) = pool_slots(cluster, pool)
    assert {s["job"] for s in status["shards"]} == {slot["metadata"]["name"]}
    pool_status = kubectl_json(cluster, "get", "batchpool", pool)["status"]
    assert pool_status["warmSlots"] == 1
    printed = cluster.kubectl("get", "batches", "-n", namespace)
    assert "completed" in printed
    assert "20" in printed


@pytest.fixture
def finalizer_policy(cluster: Any) -> Iterator[None]:
    """The admission policy of crds/admission, as the chart installs it on Kubernetes >= 1.36,
    for one test: every other test of the session runs without it, the operator adding the
    finalizer itself (older clusters)."""
    from llmbatch.commands.devstack import wait_until_batches_admitted

    policy = ROOT / "crds" / "admission"
    cluster.kubectl("apply", "-f", str(policy))
    wait_until_batches_admitted(str(cluster.kubeconfig), "default", timeout=30)
    yield
    cluster.kubectl("delete", "-f", str(policy), "--wait=true")


def test_a_batch_created_under_the_finalizer_policy_costs_no_metadata_write(
    cluster: Any,
    namespace: str,
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
    finalizer_policy: None,
) -> None:
    """With the policy the API server puts the finalizer on the Batch as it creates it: the
    operator runs the batch to the end without a write of its own to its metadata (the one
    write of a kubectl Batch that the gateway's Batches never needed)."""
    pool = make_pool(cluster, tmp_path)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4))
    batch = wait_status(cluster, operator_process, namespace, name, {"completed", "failed"})
    assert batch["status"]["status"] == "completed"
    assert batch["metadata"]["finalizers"] == ["llmbatch.io/cleanup"]
    batch = kubectl_json(cluster, "get", "batch", name, "-n", namespace, "--show-managed-fields")
    entries = batch["metadata"]["managedFields"]
    # kubectl's create is the one writer of the object itself; the operator writes the status
    # subresource only (without the policy its finalizer patch shows here as a second writer)
    writers = {entry["manager"] for entry in entries if not entry.get("subresource")}
    assert writers == {"kubectl-client-side-apply"}, entries


def test_a_batch_of_many_shards_stays_a_small_object(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """Issue #30, item 4: a plan longer than the status lists (50 shards) is stored; the Batch
    carries only its running and failed shards, and every request still has one result."""
    pool = make_pool(cluster, tmp_path, shard_requests=2)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(100))
    sizes: list[int] = []

    def ended() -> dict[str, Any] | None:
        batch = get_batch(cluster, namespace, name)
        sizes.append(len(json.dumps(batch.get("status") or {})))
        return (
            batch if (batch.get("status") or {}).get("status") in ("completed", "failed") else None
        )

    status = wait_for(ended, 180, f"batch {name} to end", operator_process.logs)["status"]
    assert status["status"] == "completed", status
    assert status["shardPlan"]["count"] == 50
    assert status["succeededShards"]["count"] == 50
    assert status["shards"] == []
    # listed whole, 50 shards would be ~10 KB of status in every watch event and patch
    assert max(sizes) < 4096, max(sizes)
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(100))
    assert_accounted(status, outputs, [])


def test_invalid_input_fails_without_jobs(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path)
    good = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [], "max_tokens": 8},
    }
    other = {"model": "other", "messages": [], "max_tokens": 8}
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({**good, "custom_id": "a"}),
        json.dumps({**good, "custom_id": "c", "url": "/v1/embeddings"}),
        json.dumps({**good, "custom_id": "d", "body": other}),
        json.dumps({k: v for k, v in good.items() if k != "custom_id"}),
        json.dumps({**good, "custom_id": "f", "body": {**good["body"], "stream": True}}),
        json.dumps({**good, "custom_id": "g", "body": {"model": MODEL, "messages": []}}),
    ]
    file_id = f"file-{uuid.uuid4().hex}"
    data = ("\n".join(lines) + "\n").encode()
    store_of(operator_process).put(file_key(namespace, file_id), data)
    apply(
        cluster, tmp_path, batch_file(namespace, file_id, len(data), file_key(namespace, file_id))
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, input_file_id=file_id)
    batch = wait_status(cluster, operator_process, namespace, name, {"failed", "in_progress"})
    status = batch["status"]
    assert status["status"] == "failed"
    assert status["failedAt"] >= status["createdAt"]
    got = [(e["code"], e.get("line")) for e in status["errors"]]
    assert got == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
        ("mismatched_url", 4),
        ("mismatched_model", 5),
        ("missing_custom_id", 6),
        ("stream_not_supported", 7),
        ("missing_output_token_limit", 8),  # seed 000, on this catalog (Tokens) pool
    ]
    assert pool_slots(cluster, pool) == []


def test_rows_without_an_output_limit_fail_a_catalog_batch_not_a_relaxed_private_one(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """Seed 000 for kubectl input: on a token-billed pool the batch fails naming the line; a
    private (GPUTime) pool that relaxes the rule runs it."""
    requests = chat_requests(3)
    del requests[1]["body"]["max_tokens"]
    catalog = make_pool(cluster, tmp_path)
    name = make_batch(cluster, tmp_path, namespace, pool=catalog, requests=requests)
    status = wait_status(cluster, operator_process, namespace, name, {"failed", "in_progress"})[
        "status"
    ]
    assert status["status"] == "failed"
    assert [(e["code"], e.get("line")) for e in status["errors"]] == [
        ("missing_output_token_limit", 2)
    ]
    private = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(private)
    relaxed = simulated_pool(
        private,
        MODEL,
        billing={"mode": "GPUTime"},
        limits={"requireOutputTokenLimit": False},
    )
    apply(cluster, tmp_path, relaxed)
    name = make_batch(cluster, tmp_path, namespace, pool=private, requests=requests)
    status = wait_status(cluster, operator_process, namespace, name, {"failed", "completed"})[
        "status"
    ]
    assert status["status"] == "completed", status.get("errors")
    assert status["requestCounts"] == {"total": 3, "completed": 3, "failed": 0}


def test_batch_file_pointing_at_another_tenants_bytes_is_refused(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path)
    victim = f"file-{uuid.uuid4().hex}"
    secret = json.dumps(
        {
            "custom_id": "secret",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": []},
        }
    )
    store_of(operator_process).put(file_key("other-tenant", victim), f"{secret}\n".encode())
    file_id = f"file-{uuid.uuid4().hex}"
    stolen = batch_file(namespace, file_id, len(secret) + 1, file_key("other-tenant", victim))
    apply(cluster, tmp_path, stolen)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, input_file_id=file_id)
    status = wait_status(cluster, operator_process, namespace, name, {"failed", "in_progress"})[
        "status"
    ]
    assert status["status"] == "failed"
    assert [e["code"] for e in status["errors"]] == ["invalid_file"]
    assert "outside its own file" in status["errors"][0]["message"]


def _staged(operator: OperatorProcess, namespace: str, requests: list[dict[str, Any]]) -> Any:
    """Stage inline requests as the gateway does; the Batch's ``spec.inlineInput`` for a name."""
    rows = [
        {"custom_id": r["customID"], **{k: r[k] for k in ("method", "url", "body")}}
        for r in requests
    ]
    data = b"".join(orjson.dumps(row) + b"\n" for row in rows)

    def spec_for(name: str, key: str | None = None) -> dict[str, Any]:
        key = key or inline_staging_key(namespace, batch_id_from_name(name))
        store_of(operator).put(key, data)
        sha = hashlib.sha256(data).hexdigest()
        return {"key": key, "requests": len(rows), "bytes": len(data), "sha256": sha}

    return spec_for


def test_staged_inline_input_is_pinned_run_and_its_staging_removed(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """Issue #30: the gateway stages inline requests in the store and the Batch only refers to
    them; the operator runs them like an upload and removes the staged copy once pinned."""
    pool = make_pool(cluster, tmp_path)
    requests = chat_requests(3, prefix="staged")
    name = make_batch(
        cluster,
        tmp_path,
        namespace,
        pool=pool,
        inline_input=_staged(operator_process, namespace, requests),
    )
    batch = wait_status(cluster, operator_process, namespace, name, {"completed", "failed"})
    status = batch["status"]
    assert status["status"] == "completed", status
    outputs = read_lines(operator_process, namespace, status.get("outputFileID"))
    assert sorted(o["custom_id"] for o in outputs) == ["staged-0", "staged-1", "staged-2"]
    staging = batch["spec"]["inlineInput"]["key"]
    assert store_of(operator_process).head(staging) is None


def test_staged_inline_input_under_another_batchs_key_is_refused(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """A Batch applied by hand cannot point ``inlineInput`` at someone else's staged requests."""
    pool = make_pool(cluster, tmp_path)
    stage = _staged(operator_process, namespace, chat_requests(1))
    victim = inline_staging_key("other-tenant", f"batch_{uuid.uuid4().hex[:24]}")
    name = make_batch(
        cluster, tmp_path, namespace, pool=pool, inline_input=lambda _: stage("", key=victim)
    )
    status = wait_status(cluster, operator_process, namespace, name, {"failed", "in_progress"})[
        "status"
    ]
    assert status["status"] == "failed"
    assert [e["code"] for e in status["errors"]] == ["invalid_input"]
    assert store_of(operator_process).head(victim) is not None  # not read, not removed


def test_model_not_served_fails_clearly(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    requests = chat_requests(2)
    for request in requests:
        request["body"]["model"] = "no-such-model"
    batch_name = f"batch-{uuid.uuid4().hex[:24]}"
    apply(
        cluster,
        tmp_path,
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "Batch",
            "metadata": {"name": batch_name, "namespace": namespace},
            "spec": {"endpoint": "/v1/chat/completions", "requests": requests},
        },
    )
    status = wait_status(cluster, operator_process, namespace, batch_name, {"failed"})["status"]
    assert status["errors"][0]["code"] == "model_not_found"
    assert "no-such-model" in status["errors"][0]["message"]


def test_cancel_mid_run_keeps_finished_results(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(
        cluster,
        tmp_path,
        max_slots=1,
        shard_requests=40,
        engine_args=["--latency-seconds=1", "--max-num-seqs=1"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))

    def some_done() -> bool:
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get("requestCounts")
        return bool(counts and counts["completed"] >= 3)

    wait_for(some_done, 120, "first results", operator_process.logs)
    cluster.kubectl(
        "patch", "batch", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"cancel":true}}'
    )
    asked = time.monotonic()
    batch = wait_status(cluster, operator_process, namespace, name, {"cancelled"}, timeout=90)
    assert time.monotonic() - asked < 60
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status.get("outputFileID"))
    errors = read_lines(operator_process, namespace, status.get("errorFileID"))
    assert len(outputs) >= 3
    assert errors, f"unrun requests must be reported\n{status}\n{operator_process.logs()}"
    assert all(e["error"]["code"] == "batch_cancelled" and e["response"] is None for e in errors)
    assert_accounted(status, outputs, errors)
    assert status["requestCounts"]["total"] == 40
    assert status["cancellingAt"] <= status["cancelledAt"]


def test_expiry_reports_unrun_requests(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(
        cluster,
        tmp_path,
        max_slots=1,
        shard_requests=100,
        engine_args=["--latency-seconds=2", "--max-num-seqs=1"],
    )  # 2 requests in flight, 2 s each: the 60 need a minute, four times the window
    name = make_batch(
        cluster, tmp_path, namespace, pool=pool, requests=chat_requests(60), window="15s"
    )
    batch = wait_status(cluster, operator_process, namespace, name, {"expired"}, timeout=120)
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status.get("outputFileID"))
    errors = read_lines(operator_process, namespace, status.get("errorFileID"))
    assert errors
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert_accounted(status, outputs, errors)
    assert status["expiredAt"] >= status["expiresAt"]


def test_failing_shard_becomes_shard_failed_lines(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    # every request crashes the engine (a broken model server): each crash is laid at the
    # requests inside, which run alone next and are given up after a second crash; a shard under
    # which the engine crashed more than its budget (twice its attempts) is given up
    pool = make_pool(
        cluster,
        tmp_path,
        shard_requests=10,
        backoff_limit=1,
        engine_args=["--crash-pattern=.", "--max-num-seqs=1"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(20))
    batch = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=240)
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status.get("outputFileID"))
    errors = read_lines(operator_process, namespace, status.get("errorFileID"))
    failed = [e for e in errors if (e.get("error") or {}).get("code") == "shard_failed"]
    assert failed, errors
    assert "shard failed" in failed[0]["error"]["message"]
    assert "engine crashed" in failed[0]["error"]["message"]
    crashed = [e for e in errors if e.get("response")]  # given up after crashing it twice
    assert all(
        e["response"]["body"]["error"]["code"] == "request_crashed_engine" for e in crashed
    ), crashed
    assert_accounted(status, outputs, errors)
    assert all(s["phase"] == "Failed" for s in status["shards"])
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=ShardFailed"
    )
    assert "its unfinished requests become shard_failed" in events


def test_operator_killed_with_a_slot_running_resumes_exactly(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(
        cluster,
        tmp_path,
        shard_requests=10,
        engine_args=["--latency-seconds=0.2", "--max-num-seqs=2"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(30))
    wait_for(lambda: pool_slots(cluster, pool), 60, "a slot Job", operator_process.logs)
    operator_process.restart()  # SIGKILL: whatever status patch was pending is lost
    batch = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=240)
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(30))
    assert_accounted(status, outputs, [])
    assert all(s["job"] for s in status["shards"])  # the slot that ran each shard


def test_operator_killed_mid_run_of_a_stored_plan_resumes_exactly(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """Issue #30, item 4: the same kill while a 30-shard batch (its plan in the store, its
    status listing only running shards) is half done: nothing lost, nothing run twice."""
    pool = make_pool(
        cluster,
        tmp_path,
        shard_requests=2,
        engine_args=["--latency-seconds=0.2", "--max-num-seqs=2"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(60))

    def half_done() -> bool:
        status = get_batch(cluster, namespace, name).get("status") or {}
        return int((status.get("succeededShards") or {}).get("count") or 0) >= 5

    wait_for(half_done, 120, "5 shards succeeded", operator_process.logs)
    operator_process.restart()  # SIGKILL
    batch = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=240)
    status = batch["status"]
    assert status["shardPlan"]["count"] == 30
    assert status["succeededShards"]["count"] == 30
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(60))
    assert_accounted(status, outputs, [])


def test_deleted_executor_pod_is_retried_without_duplicates(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(
        cluster,
        tmp_path,
        max_slots=1,
        shard_requests=40,
        engine_args=["--latency-seconds=0.5", "--max-num-seqs=2"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))

    def running_pod() -> str | None:
        pods = kubectl_json(
            cluster, "get", "pods", "-n", WORKER_NAMESPACE, "-l", f"llmbatch.io/pool={pool}"
        )["items"]
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get(
            "requestCounts"
        ) or {}
        for pod in pods:
            if pod["status"].get("phase") == "Running" and counts.get("completed", 0) >= 5:
                return str(pod["metadata"]["name"])
        return None

    pod = wait_for(running_pod, 120, "a running executor with results", operator_process.logs)
    cluster.kubectl("delete", "pod", pod, "-n", WORKER_NAMESPACE, "--wait=false")
    batch = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=240)
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(40))
    assert_accounted(status, outputs, [])


def _slot_processes(pool: str) -> list[psutil.Process]:
    """The executor processes of the pool's slots (pods run as local processes here)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "llmbatch.executor" in cmdline and f"slots/{pool}/" in cmdline:
            found.append(proc)
    return found


def test_a_hung_slot_loses_its_shards_to_another_and_nothing_is_lost(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """A slot process frozen mid-shard (SIGSTOP: no heartbeat, no progress, no exit) loses its
    lease after LLMBATCH_SLOT_LEASE_SECONDS (10 s here): its Job is deleted, which ends the frozen
    process, and the shard resumes on a new slot from its committed chunks."""
    pool = make_pool(
        cluster,
        tmp_path,
        max_slots=1,
        shard_requests=40,
        engine_args=["--latency-seconds=0.5", "--max-num-seqs=2"],
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))

    def frozen_slot() -> list[psutil.Process] | None:
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get("requestCounts")
        procs = _slot_processes(pool)
        return procs if procs and (counts or {}).get("completed", 0) >= 5 else None

    hung = wait_for(frozen_slot, 120, "a slot with results", operator_process.logs)
    first_job = {j["metadata"]["name"] for j in pool_slots(cluster, pool)}
    for proc in hung:
        proc.suspend()
    batch = wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=240)
    status = batch["status"]
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert sorted(line["custom_id"] for line in outputs) == sorted(f"req-{i}" for i in range(40))
    assert_accounted(status, outputs, [])
    (shard,) = status["shards"]
    assert shard["reruns"] == 1  # the lost slot counted one attempt
    assert shard["job"] not in first_job  # finished on another slot
    wait_for(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in hung),
        60,
        "the frozen slot process to be ended with its Job",
        operator_process.logs,
    )


def test_metrics_have_no_per_batch_labels(operator_process: OperatorProcess) -> None:
    text = operator_process.metrics()
    assert "llmbatch_batch_transitions_total" in text
    assert "batch-" not in text


def test_pool_at_capacity_fails_fast(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path, limits={"maxQueuedRequests": 5})
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(10))
    status = wait_status(cluster, operator_process, namespace, name, {"failed"})["status"]
    assert status["errors"][0]["code"] == "capacity_exceeded"
    assert "limit of 5" in status["errors"][0]["message"]


def test_batch_names_must_carry_the_batch_prefix(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    with pytest.raises(AssertionError, match="a Batch name starts with batch-"):
        apply(
            cluster,
            tmp_path,
            {
                "apiVersion": "llmbatch.io/v1alpha1",
                "kind": "Batch",
                "metadata": {"name": "my-job", "namespace": namespace},
                "spec": {"endpoint": "/v1/chat/completions", "requests": chat_requests(1)},
            },
        )


def test_a_batch_deleted_mid_run_is_cleaned_up_and_goes(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """The operator's own finalizer: added to a Batch created without it (kubectl), held while
    its shards are taken back and its work area removed, then let go so the object goes. kopf
    writes nothing on a Batch (no finalizer, no last-handled-configuration annotation)."""
    pool = make_pool(
        cluster, tmp_path, max_slots=1, shard_requests=40,
        engine_args=["--latency-seconds=1", "--max-num-seqs=1"],
    )  # fmt: skip
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))
    uid = batch_uid(cluster, namespace, name)

    def running() -> bool:
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get("requestCounts")
        return bool(counts and counts["completed"] >= 1)

    wait_for(running, 120, "first results", operator_process.logs)
    meta = get_batch(cluster, namespace, name)["metadata"]
    assert meta["finalizers"] == ["llmbatch.io/cleanup"]
    assert not any(k.startswith("llmbatch.io/last-handled") for k in meta.get("annotations") or {})
    work_area = f"work/{namespace}/{uid}/"
    assert list(store_of(operator_process).list(work_area))
    cluster.kubectl("delete", "batch", name, "-n", namespace, "--wait=false")

    def gone() -> bool:
        listed = kubectl_json(cluster, "get", "batches", "-n", namespace)["items"]
        return all(b["metadata"]["name"] != name for b in listed)

    wait_for(gone, 60, "the Batch removed", operator_process.logs)
    assert list(store_of(operator_process).list(work_area)) == []
