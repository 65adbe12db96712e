"""Retention on the real control plane: shortened clocks delete exactly what is due.

The session operator sweeps every second (tests/fixtures/operator.py); the clocks are shortened
where a deployment would shorten them: a pool's ``spec.retention`` for the files of its batches,
and an input file's own ``spec.expiresAt`` (an input may ask for less than 24 h). Everything else
runs on the defaults, so the other tests' files are not touched.
"""

from __future__ import annotations

import json
import pathlib
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest

from llmbatch.core import keys
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.retention import SETTLE_SECONDS
from tests.fixtures.operator import OperatorProcess, simulated_pool
from tests.integration.test_credits import (  # noqa: F401  (the tenants fixture)
    Tenant,
    tenants,
)
from tests.integration.test_operator import (
    _POOLS,
    MODEL,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    get_batch,
    make_batch,
    store_of,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
FILES_EXPIRED = "llmbatch_retention_files_expired_total"
FREED = "llmbatch_retention_freed_bytes_total"


def make_pool(
    cluster: Any,
    tmp_path: pathlib.Path,
    retention: dict[str, int],
    node_selector: dict[str, str] | None = None,
) -> str:
    name = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(name)
    extra: dict[str, Any] = {"retention": retention}
    if node_selector:
        extra["nodeSelector"] = node_selector  # no node matches: the batch stays in_progress
    apply(cluster, tmp_path, simulated_pool(name, MODEL, **extra))
    return name


def upload(
    cluster: Any,
    operator: OperatorProcess,
    tmp_path: pathlib.Path,
    namespace: str,
    requests: int = 3,
    expires_in: int | None = None,
) -> tuple[str, int]:
    """An input file as the gateway stores it: bytes under the id's key plus a BatchFile."""
    file_id = keys.new_file_id()
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            },
        }
        for i in range(requests)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    store_of(operator).put(keys.file_key(namespace, file_id), data)
    now = int(time.time())
    spec: dict[str, Any] = {
        "id": file_id,
        "bytes": len(data),
        "filename": "requests.jsonl",
        "purpose": "batch",
        "lineCount": requests,
        "storageKey": keys.file_key(namespace, file_id),
        "createdAt": now,
        "expiresAt": now + (expires_in if expires_in is not None else 86400),
    }
    apply(
        cluster,
        tmp_path,
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "BatchFile",
            "metadata": {"name": file_id, "namespace": namespace},
            "spec": spec,
        },
    )
    return file_id, len(data)


def batch_file(cluster: Any, namespace: str, file_id: str) -> dict[str, Any] | None:
    out = cluster.kubectl(
        "get", "batchfile", file_id, "-n", namespace, "--ignore-not-found", "-o", "json"
    )
    return json.loads(out) if out.strip() else None


def stored(operator: OperatorProcess, namespace: str, file_id: str) -> bool:
    return store_of(operator).head(keys.file_key(namespace, file_id)) is not None


def gone(cluster: Any, operator: OperatorProcess, namespace: str, file_id: str) -> bool:
    """Both halves are gone: the bytes in the store and the BatchFile."""
    return (
        not stored(operator, namespace, file_id) and batch_file(cluster, namespace, file_id) is None
    )


def kept(cluster: Any, operator: OperatorProcess, namespace: str, file_id: str) -> bool:
    return (
        stored(operator, namespace, file_id) and batch_file(cluster, namespace, file_id) is not None
    )


def work_keys(operator: OperatorProcess, namespace: str, uid: str) -> list[str]:
    return [i.key for i in store_of(operator).list(keys.work_prefix(namespace, uid) + "/")]


def metric(operator: OperatorProcess, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.compile(rf"^{name}\{{{re.escape(wanted)}\}} (\S+)$", re.MULTILINE)
    match = pattern.search(operator.metrics())
    return float(match.group(1)) if match else 0.0


def test_retention_deletes_exactly_what_is_due_and_nothing_in_use(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    op = operator_process
    fast = make_pool(cluster, tmp_path, {"outputSeconds": 5, "inputAfterBatchSeconds": 0})
    stuck = make_pool(
        cluster,
        tmp_path,
        {"acceptedInputSeconds": 1, "outputSeconds": 5},
        node_selector={"llmbatch.io/test-no-such-node": "true"},
    )
    short_lived, short_size = upload(cluster, op, tmp_path, namespace, expires_in=4)
    assert kept(cluster, op, namespace, short_lived)  # not before it is due
    long_lived, _ = upload(cluster, op, tmp_path, namespace)
    finished_input, _ = upload(cluster, op, tmp_path, namespace, requests=12)
    # Its own expiry passes while its batch runs (the batch exists well before it does).
    running_input, _ = upload(cluster, op, tmp_path, namespace, expires_in=20)
    running_due = time.time() + 20
    done_name = make_batch(cluster, tmp_path, namespace, pool=fast, input_file_id=finished_input)
    run_name = make_batch(cluster, tmp_path, namespace, pool=stuck, input_file_id=running_input)
    expired_before = metric(op, FILES_EXPIRED, purpose="batch")
    freed_before = metric(op, FREED, area="input")

    # 1. An input no batch uses goes when its own (short) expiry passes: bytes and object.
    wait_for(lambda: gone(cluster, op, namespace, short_lived), 30, "short-lived input gone")
    assert kept(cluster, op, namespace, long_lived)

    # 2. A finished batch: its input goes after it finished; its results after their 5 s
    #    lifetime (no sooner than SETTLE_SECONDS after the batch); its work area once.
    done = wait_status(cluster, op, namespace, done_name, {"completed"}, timeout=180)
    status = done["status"]
    uid = done["metadata"]["uid"]
    assert status["requestCounts"] == {"total": 12, "completed": 12, "failed": 0}
    output_id = status["outputFileID"]
    out = batch_file(cluster, namespace, output_id)
    assert out is not None
    assert out["spec"]["expiresAt"] == out["spec"]["createdAt"] + 5  # the pool's output lifetime
    assert time.time() < status["completedAt"] + SETTLE_SECONDS - 5
    assert kept(cluster, op, namespace, output_id)  # nothing the batch used goes at once
    assert kept(cluster, op, namespace, finished_input)
    wait_for(lambda: gone(cluster, op, namespace, finished_input), 90, "accepted input gone")
    wait_for(lambda: gone(cluster, op, namespace, output_id), 90, "output gone")
    wait_for(
        lambda: (get_batch(cluster, namespace, done_name).get("status") or {}).get("workRemovedAt"),
        60,
        "work area marked removed",
    )
    assert work_keys(op, namespace, uid) == []
    assert (
        status["outputFileID"] == get_batch(cluster, namespace, done_name)["status"]["outputFileID"]
    )  # the batch still names its (now expired) results, as OpenAI's do

    # 3. A running batch's input stays although both of its clocks (its own 20 s, the pool's
    #    1 s after acceptance) passed: shown is the end of the batch's window.
    running = wait_status(cluster, op, namespace, run_name, {"in_progress"}, timeout=60)
    assert time.time() > running_due
    window_end = running["status"]["expiresAt"]
    obj = wait_for(
        lambda: (
            (o := batch_file(cluster, namespace, running_input))
            and (o.get("status") or {}).get("expiresAt") == window_end
            and o
        ),
        30,
        "the running batch's input shows the window's end",
    )
    assert obj["status"]["usedBy"] == [batch_id_from_name(run_name)]
    assert stored(op, namespace, running_input)
    assert work_keys(op, namespace, running["metadata"]["uid"])  # its shard spec stays too
    assert metric(op, FILES_EXPIRED, purpose="batch") >= expired_before + 2
    assert metric(op, FREED, area="input") >= freed_before + short_size

    # 4. Further sweeps change nothing of what is kept (no deletion, no status churn).
    versions = {
        f: (batch_file(cluster, namespace, f) or {})["metadata"]["resourceVersion"]
        for f in (long_lived, running_input)
    }
    time.sleep(5)
    for f, version in versions.items():
        assert kept(cluster, op, namespace, f)
        assert (batch_file(cluster, namespace, f) or {})["metadata"]["resourceVersion"] == version

    # 5. Once that batch ends (cancelled), its input follows.
    cluster.kubectl(
        "patch",
        "batch",
        run_name,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"cancel":true}}',
    )
    wait_status(cluster, op, namespace, run_name, {"cancelled"}, timeout=120)
    wait_for(lambda: gone(cluster, op, namespace, running_input), 90, "input of cancelled batch")
    assert kept(cluster, op, namespace, long_lived)
    assert metric(op, FILES_EXPIRED, purpose="batch_output") >= 1
    assert "retention sweep failed" not in op.logs()
    assert "retention step failed" not in op.logs()


def test_retention_carries_on_after_a_restart(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """State lives on the objects: a sweep cut short (bytes deleted, object not) is finished by
    the next operator, and files that came due while it was down go at its first sweep."""
    op = operator_process
    op.kill()
    try:
        due, due_size = upload(cluster, op, tmp_path, namespace, expires_in=1)
        half_done, _ = upload(cluster, op, tmp_path, namespace, expires_in=1)
        store_of(op).delete(keys.file_key(namespace, half_done))  # the crash came between
        keep, _ = upload(cluster, op, tmp_path, namespace)
        time.sleep(2)
        assert batch_file(cluster, namespace, due) is not None  # nobody sweeps meanwhile
    finally:
        op.start()
    wait_for(lambda: gone(cluster, op, namespace, due), 60, "due file gone after restart")
    wait_for(lambda: gone(cluster, op, namespace, half_done), 60, "half-deleted file finished")
    assert kept(cluster, op, namespace, keep)
    assert metric(op, FILES_EXPIRED, purpose="batch") >= 2  # a fresh process counts from zero
    assert metric(op, FREED, area="input") >= due_size


def sweeps(operator: OperatorProcess) -> float:
    found = re.search(
        r"^llmbatch_retention_sweep_duration_seconds_count (\S+)$", operator.metrics(), re.M
    )
    return float(found.group(1)) if found else 0.0


def test_expires_after_from_the_sdk_is_what_retention_keeps(
    cluster: Any,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],  # noqa: F811  (the fixture imported above)
    tmp_path: pathlib.Path,
) -> None:
    """Issue #16: ``files.create(expires_after=...)`` replaces the 24 h default for an unused
    input, longer or shorter, and caps how long an accepted input outlives its batch."""
    op = operator_process
    model = f"expiry-model-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(pool)
    grace = {"inputAfterBatchSeconds": 86400}  # would keep an accepted input a day
    apply(cluster, tmp_path, simulated_pool(pool, model, retention=grace))
    namespace, client = tenants(credit="100")
    row = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    }
    data = json.dumps(row).encode() + b"\n"

    def create(seconds: int) -> Any:
        return client.files.create(
            file=("r.jsonl", data),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": seconds},
        )

    month, hour = create(2592000), create(3600)
    batch = client.batches.create(
        input_file_id=hour.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    name = "batch-" + batch.id.removeprefix("batch_")
    wait_status(cluster, op, namespace, name, {"completed"})
    # the accepted input's expiry is the asked hour, not the pool's day after the batch
    wait_for(
        lambda: client.files.retrieve(hour.id).expires_at == hour.created_at + 3600,
        30,
        "the accepted input's expiry capped at its expires_after",
    )
    swept = sweeps(op)
    wait_for(lambda: sweeps(op) >= swept + 2, 30, "two more retention sweeps")
    # the unused input keeps its 30 days (the sweep does not cut it to the 24 h default)
    assert client.files.retrieve(month.id).expires_at == month.created_at + 2592000
    obj = batch_file(cluster, namespace, month.id)
    assert obj is not None
    assert (obj.get("status") or {}).get("expiresAt") in (None, month.created_at + 2592000)
    assert kept(cluster, op, namespace, month.id)


def test_a_staged_inline_input_whose_batch_never_came_is_removed(
    namespace: str, operator_process: OperatorProcess
) -> None:
    """The gateway stages inline requests just before it creates the Batch; when the create
    fails the staged object has no Batch: retention removes it (at the second sweep that finds
    it alone, so one racing the create is spared)."""
    op = operator_process
    orphan = keys.inline_staging_key(namespace, f"batch_{uuid.uuid4().hex[:24]}")
    store_of(op).put(orphan, b'{"custom_id": "r1"}\n')
    before = sweeps(op)
    wait_for(lambda: store_of(op).head(orphan) is None, 60, "unclaimed staged input removed")
    assert sweeps(op) >= before + 2


def test_a_finished_batch_past_its_ttl_leaves_etcd_and_still_answers_through_the_sdk(
    cluster: Any,
    operator_process: OperatorProcess,
    tenants: Callable[..., Tenant],  # noqa: F811  (the fixture imported above)
    tmp_path: pathlib.Path,
) -> None:
    """Issue #30: etcd holds the working set, not the history. A finished Batch leaves the API
    server after the pool's ``retention.batchSeconds`` (once its work area is gone, 30 s after
    it finished); ``retrieve`` and ``list`` still answer for it from the archive, and its
    results stay downloadable until their own expiry."""
    op = operator_process
    model = f"ttl-model-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(pool)
    apply(cluster, tmp_path, simulated_pool(pool, model, retention={"batchSeconds": 1}))
    namespace, client = tenants(credit="100")
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"{i}"}],
                "max_tokens": 8,
            },
        }
        for i in range(3)
    ]
    created = client.post(
        "/batches",
        body={"requests": rows, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        cast_to=openai.types.Batch,
    )
    name = "batch-" + created.id.removeprefix("batch_")
    done = wait_status(cluster, op, namespace, name, {"completed"})
    output_id = done["status"]["outputFileID"]

    def gone() -> bool:
        listed = cluster.kubectl("get", "batches", "-n", namespace, "-o", "name")
        return f"/{name}" not in listed

    wait_for(gone, 120, "the finished Batch gone from the API server")
    assert store_of(op).head(keys.archive_key(namespace, created.id)) is not None
    archived = client.batches.retrieve(created.id)
    assert archived.status == "completed"
    assert archived.output_file_id == output_id
    assert archived.request_counts is not None
    assert archived.request_counts.completed == 3
    assert [b.id for b in client.batches.list()] == [created.id]
    lines = client.files.content(output_id).text.splitlines()
    assert sorted(json.loads(x)["custom_id"] for x in lines) == ["r0", "r1", "r2"]
