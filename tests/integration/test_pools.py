"""Pools on the real control plane: expedited ahead of standard, flex last, preemption, tiers,
scale-down of warm slots, expedited requests overtaking inside a busy slot, pool edits rolling
the slots.

One-slot pools running one shard at a time (``--max-num-seqs=1``: slotConcurrency 1) and the
simulated engine make the order observable: each batch is one shard, and a shard holds the only
slot for several seconds.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import pytest

from llmbatch.api.slot import SlotHeartbeat
from tests.fixtures.operator import WORKER_NAMESPACE, OperatorProcess
from tests.integration.test_operator import (
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    chat_requests,
    get_batch,
    kubectl_json,
    make_batch,
    make_pool,
    read_lines,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
SLOW = ["--latency-seconds=0.5", "--max-num-seqs=1"]


def test_expedited_runs_next_and_flex_waits_behind_both(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path, max_slots=1, shard_requests=50, engine_args=SLOW)
    first = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(10))
    wait_for(
        lambda: (
            [
                s["phase"]
                for s in (get_batch(cluster, namespace, first).get("status") or {}).get("shards")
                or []
            ]
            == ["Running"]
        ),
        60,
        "first batch running on the slot",
    )
    # queued while the slot is busy, in this order: flex, standard, expedited
    flex = make_batch(
        cluster,
        tmp_path,
        namespace,
        pool=pool,
        requests=chat_requests(4),
        metadata={"tier": "flex"},
    )
    standard = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4))
    expedited = make_batch(
        cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4), priority="expedited"
    )
    done = {}
    for name in (first, flex, standard, expedited):
        done[name] = wait_status(
            cluster, operator_process, namespace, name, {"completed"}, timeout=300
        )["status"]["completedAt"]
    assert done[expedited] <= done[standard] <= done[flex]
    # No order between `first` and the expedited batch: the expedited shard takes the full
    # slot's express seat and runs beside `first` (docs/pools.md), so either may end first.
    flex_status = get_batch(cluster, namespace, flex)["status"]
    assert flex_status["expiresAt"] - flex_status["createdAt"] == 72 * 3600


def test_preemption_lets_expedited_start_at_once_without_duplicates(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path, max_slots=1, shard_requests=100, engine_args=SLOW)
    cluster.kubectl(
        "patch", "batchpool", pool, "--type=merge", "-p", '{"spec":{"preemption":"LowerPriority"}}'
    )
    standard = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(60))

    def some_done() -> bool:
        counts = (get_batch(cluster, namespace, standard).get("status") or {}).get(
            "requestCounts"
        ) or {}
        return counts.get("completed", 0) >= 4

    wait_for(some_done, 120, "standard batch under way", operator_process.logs)
    # the slot's one seat (max_num_seqs 1) holds the standard shard: the first expedited batch
    # takes the express seat beside it, the second finds no seat and takes the standard one's
    expedited = [
        make_batch(
            cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4), priority="expedited"
        )
        for _ in range(2)
    ]
    for name in expedited:
        exp_status = wait_status(
            cluster, operator_process, namespace, name, {"completed"}, timeout=120
        )["status"]
        errors = read_lines(operator_process, namespace, exp_status.get("errorFileID"))
        assert exp_status["requestCounts"]["completed"] == 4, (errors, exp_status.get("shards"))
    still = get_batch(cluster, namespace, standard)["status"]
    assert still["status"] == "in_progress", "the expedited batches had to wait for the slot"
    final = wait_status(cluster, operator_process, namespace, standard, {"completed"}, timeout=300)[
        "status"
    ]
    outputs = read_lines(operator_process, namespace, final["outputFileID"])
    ids = [line["custom_id"] for line in outputs]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(60))
    assert len(ids) == len(set(ids))
    assert final["shards"][0]["preemptions"] == 1
    events = cluster.kubectl("get", "events", "-A", "--field-selector", "reason=Preempted")
    assert "for expedited work" in events


def test_expedited_disabled_for_tenant_is_rejected(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path)
    cluster.kubectl("annotate", "namespace", namespace, "llmbatch.io/expedited-disabled=true")
    name = make_batch(
        cluster, tmp_path, namespace, pool=pool, requests=chat_requests(2), priority="expedited"
    )
    status = wait_status(cluster, operator_process, namespace, name, {"failed"})["status"]
    assert status["errors"][0]["code"] == "expedited_not_allowed"


def test_autoscaler_rises_with_backlog_and_falls_when_drained(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    # a slow throughput seed and a tight standard drain target: the backlog asks for every slot
    pool = make_pool(
        cluster, tmp_path, max_slots=3, shard_requests=5, engine_args=SLOW, throughput="0.1"
    )
    cluster.kubectl(
        "patch",
        "batchpool",
        pool,
        "--type=merge",
        "-p",
        '{"spec":{"scaleDownCooldownSeconds":5,"tiers":{"standard":{"drainTargetSeconds":10}}}}',
    )
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(30))

    def desired() -> int:
        out = cluster.kubectl("get", "batchpool", pool, "-o", "jsonpath={.status.desiredSlots}")
        return int(out or 0)

    wait_for(lambda: desired() == 3, 60, "desired slots at max", operator_process.logs)
    wait_status(cluster, operator_process, namespace, name, {"completed"}, timeout=300)
    wait_for(lambda: desired() == 0, 60, "desired slots back at min", operator_process.logs)

    def slot_pods_running() -> bool:
        pods = cluster.kubectl(
            "get",
            "pods",
            "-n",
            WORKER_NAMESPACE,
            "-l",
            f"llmbatch.io/pool={pool}",
            "--no-headers",
            check=False,
        )
        return "Running" in pods

    # Scale-down drains the idle slots: each sees its drain request at its next poll, exits 0,
    # and its pod ends (asynchronous: a slot may still be loading when the drain is asked).
    wait_for(lambda: not slot_pods_running(), 90, "the idle slots drained", operator_process.logs)


def _shard_counts(store_root: pathlib.Path, pool: str) -> dict[str, tuple[str, int]]:
    """Each shard's state and results as the pool's slots report them in their heartbeats."""
    counts: dict[str, tuple[str, int]] = {}
    for path in (store_root / "slots" / pool).glob("*/heartbeat.json"):
        try:
            beat = SlotHeartbeat.model_validate_json(path.read_bytes())
        except (OSError, ValueError):
            continue  # being replaced
        counts |= {r.key: (r.state, r.completed) for r in beat.shards}
    return counts


def test_an_expedited_batch_overtakes_inside_a_busy_slot(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """One slot, one engine answering 2 requests at a time, a standard shard keeping 30 in it
    and holding the slot's only seat: an expedited batch starts at once in the slot's express
    seat and is answered ahead of the ~28 standard requests queued in the engine (request
    priority per tier), and the standard batch loses nothing."""
    pool = make_pool(
        cluster,
        tmp_path,
        max_slots=1,
        shard_requests=100,
        engine_args=["--latency-seconds=0.5", "--max-num-seqs=15", "--max-running=2"],
    )  # the slot sizes slotConcurrency 15 // 8 = 1: the standard shard fills it
    standard = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(80))
    store = operator_process.store_root

    def standard_answering() -> bool:
        return any(c >= 4 for _, c in _shard_counts(store, pool).values())

    wait_for(standard_answering, 120, "the standard shard answering", operator_process.logs)
    expedited = make_batch(
        cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4), priority="expedited"
    )
    standard_uid = get_batch(cluster, namespace, standard)["metadata"]["uid"]
    expedited_uid = get_batch(cluster, namespace, expedited)["metadata"]["uid"]

    def progress() -> tuple[int | None, tuple[str, int] | None]:
        """Answered so far by the standard shard (None once it no longer runs on the slot) and
        the expedited shard's (state, answered) report."""
        counts = _shard_counts(store, pool)
        std = counts.get(f"{standard_uid}-00000")
        return (None if std is None else std[1]), counts.get(f"{expedited_uid}-00000")

    seen: dict[str, list[int | None]] = {"start": [], "end": []}

    def expedited_finished() -> bool:
        std, exp = progress()
        if exp is not None and not seen["start"]:
            seen["start"].append(std)
        if exp is not None and exp[1] == 4:
            seen["end"].append(std)
            return True
        return False

    wait_for(expedited_finished, 120, "the expedited shard's results", operator_process.logs)
    # it ran beside the standard shard, which held the only seat (no waiting for the seat) ...
    start, end = seen["start"][0], seen["end"][0]
    assert start is not None, f"the expedited shard waited for the standard one to end: {seen}"
    assert end is not None, f"the standard shard ended before the expedited one: {seen}"
    # ... and the standard requests answered between its start and its last result are the
    # two running when it came (plus a heartbeat's worth), not the ~28 queued ahead of it
    assert end - start <= 12, seen
    for name, total in ((expedited, 4), (standard, 80)):
        status = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
        outputs = read_lines(operator_process, namespace, status["outputFileID"])
        assert sorted(o["custom_id"] for o in outputs) == sorted(f"req-{i}" for i in range(total))


def test_editing_a_pool_rolls_its_slots_without_interrupting_them(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """`kubectl patch` of a pool's engine args while a slot runs a shard: the shard finishes on
    its slot, which then drains and ends; a batch submitted after the edit runs on a new slot
    of the new spec; every line exactly once."""
    pool = make_pool(cluster, tmp_path, max_slots=2, shard_requests=40, engine_args=SLOW)
    first = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))

    def slot_jobs() -> dict[str, dict[str, Any]]:
        jobs = kubectl_json(
            cluster, "get", "jobs", "-n", WORKER_NAMESPACE, "-l", f"llmbatch.io/pool={pool}"
        )
        return {j["metadata"]["name"]: j for j in jobs["items"]}

    def first_answering() -> bool:
        counts = (get_batch(cluster, namespace, first).get("status") or {}).get("requestCounts")
        return bool(slot_jobs()) and (counts or {}).get("completed", 0) >= 2

    wait_for(first_answering, 120, "the first batch answering", operator_process.logs)
    (old,) = slot_jobs()
    patch = {"spec": {"executor": {"engineArgs": ["--latency-seconds=0.4", "--max-num-seqs=1"]}}}
    cluster.kubectl("patch", "batchpool", pool, "--type=merge", "-p", json.dumps(patch))
    second = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4))
    for name, total in ((first, 40), (second, 4)):
        status = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
        outputs = read_lines(operator_process, namespace, status["outputFileID"])
        assert sorted(o["custom_id"] for o in outputs) == sorted(f"req-{i}" for i in range(total))
        assert status["shards"][0]["reruns"] == 0  # nothing was interrupted
        if name == first:
            assert status["shards"][0]["job"] == old  # finished where it started
        else:
            assert status["shards"][0]["job"] != old  # a slot of the new spec

    def old_slot_ended() -> bool:
        job = slot_jobs().get(old)
        return job is None or any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in (job.get("status") or {}).get("conditions") or []
        )

    wait_for(old_slot_ended, 60, "the outdated slot drained", operator_process.logs)


def test_min_slots_are_started_before_work_and_outlive_their_idle_time(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """minSlots=1 with idleSeconds=2: a slot starts with no batch and is still up long after
    its idle time; the first batch runs on it; minSlots=0 lets it idle out."""
    pool = make_pool(cluster, tmp_path, max_slots=2)
    patch = {"spec": {"minSlots": 1, "idleSeconds": 2}}
    cluster.kubectl("patch", "batchpool", pool, "--type=merge", "-p", json.dumps(patch))

    def running_slots() -> list[str]:
        pods = kubectl_json(
            cluster, "get", "pods", "-n", WORKER_NAMESPACE, "-l", f"llmbatch.io/pool={pool}"
        )["items"]
        return sorted(
            p["metadata"]["labels"]["llmbatch.io/slot"]
            for p in pods
            if p["status"].get("phase") == "Running"
        )

    (slot,) = wait_for(running_slots, 60, "a minSlots slot running", operator_process.logs)
    time.sleep(8)  # four times its idle time
    assert running_slots() == [slot]
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(3))
    status = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    assert status["shards"][0]["job"] == slot  # the warm slot took it
    cluster.kubectl("patch", "batchpool", pool, "--type=merge", "-p", '{"spec":{"minSlots":0}}')
    wait_for(lambda: not running_slots(), 60, "the slot idled out", operator_process.logs)


def test_a_pool_deleted_under_running_batches_leaves_no_pod_and_ends_them_clearly(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """`kubectl delete batchpool` while its slot runs a shard returns only when no slot Job or
    pod of the pool is left (the operator deletes them and waits: the garbage collector alone
    may not watch a new CRD yet); the batch keeps what its slot committed, writes
    `pool_deleted` lines for the rest (each request exactly once) and ends `failed`."""
    pool = make_pool(cluster, tmp_path, max_slots=1, shard_requests=40, engine_args=SLOW)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(40))

    def answering() -> bool:
        counts = (get_batch(cluster, namespace, name).get("status") or {}).get("requestCounts")
        return (counts or {}).get("completed", 0) >= 2

    wait_for(answering, 120, "the batch answering", operator_process.logs)
    cluster.kubectl("delete", "batchpool", pool, "--timeout=120s")
    selector = f"llmbatch.io/pool={pool}"
    left = kubectl_json(cluster, "get", "jobs,pods", "-n", WORKER_NAMESPACE, "-l", selector)
    assert not left["items"], [o["metadata"]["name"] for o in left["items"]]
    status = wait_status(cluster, operator_process, namespace, name, {"failed"})["status"]
    assert [e["code"] for e in status["errors"]] == ["pool_deleted"]
    counts = status["requestCounts"]
    assert counts["total"] == 40
    assert counts["completed"] + counts["failed"] == 40
    assert counts["completed"] >= 2
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    errors = read_lines(operator_process, namespace, status["errorFileID"])
    assert {e["error"]["code"] for e in errors} == {"pool_deleted"}
    ids = [line["custom_id"] for line in outputs + errors]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(40))
    assert len(outputs) == counts["completed"]
    assert len(errors) == counts["failed"]
