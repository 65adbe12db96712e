"""Pools on the real control plane: expedited ahead of standard, flex last, preemption, tiers,
scale-down of warm slots.

One-slot pools running one shard at a time (``--max-num-seqs=1``: slotConcurrency 1) and the
simulated engine make the order observable: each batch is one shard, and a shard holds the only
slot for several seconds.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from tests.fixtures.operator import WORKER_NAMESPACE, OperatorProcess
from tests.integration.test_operator import (
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    chat_requests,
    get_batch,
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
    assert done[first] <= done[expedited]
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
    expedited = make_batch(
        cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4), priority="expedited"
    )
    exp_status = wait_status(
        cluster, operator_process, namespace, expedited, {"completed"}, timeout=120
    )["status"]
    still = get_batch(cluster, namespace, standard)["status"]
    assert still["status"] == "in_progress", "the expedited batch had to wait for the slot"
    errors = read_lines(operator_process, namespace, exp_status.get("errorFileID"))
    assert exp_status["requestCounts"]["completed"] == 4, (errors, exp_status.get("shards"))
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
