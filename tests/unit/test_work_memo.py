"""A pool round maps a batch's shards again only when its status changed (slotstate.WorkMemo)."""

from __future__ import annotations

from typing import Any

from llmbatch.controller.slotstate import WorkMemo, batch_work, work_key


def _batch(uid: str, *phases: str, pool: str = "pool-a") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": "tenant-a", "name": f"batch-{uid}"},
        "spec": {"priority": "standard"},
        "status": {
            "pool": pool,
            "status": "in_progress",
            "model": "smollm2",
            "modelRevision": "r1",
            "createdAt": 100,
            "inProgressAt": 101,
            "shards": [
                {"index": i, "phase": phase, "requestCount": 5} for i, phase in enumerate(phases)
            ],
        },
    }


def test_an_unchanged_batch_is_not_mapped_again() -> None:
    memo = WorkMemo()
    a, b = _batch("a", "Pending", "Running"), _batch("b", "Pending")
    first = memo.pool_work("pool-a", [a, b])
    assert sorted(first) == [work_key("a", 0), work_key("a", 1), work_key("b", 0)]
    assert first == {**batch_work("pool-a", a), **batch_work("pool-a", b)}
    # the same status objects (shallow copies of the entries, as the pool timer passes them)
    again = memo.pool_work("pool-a", [dict(a), dict(b)])
    assert again == first
    assert all(again[key] is first[key] for key in first)  # reused, not rebuilt


def test_a_new_status_is_mapped_again() -> None:
    memo = WorkMemo()
    a = _batch("a", "Pending", "Running")
    first = memo.pool_work("pool-a", [a])
    changed = {**a, "status": _batch("a", "Succeeded", "Running")["status"]}
    again = memo.pool_work("pool-a", [changed])
    assert sorted(again) == [work_key("a", 1)]  # the finished shard left the pool's work
    assert again[work_key("a", 1)] == first[work_key("a", 1)]
    assert again[work_key("a", 1)] is not first[work_key("a", 1)]


def test_batches_that_stop_running_are_forgotten_and_pools_keep_their_own() -> None:
    memo = WorkMemo()
    a, other = _batch("a", "Pending"), _batch("x", "Pending", pool="pool-b")
    memo.pool_work("pool-a", [a])
    memo.pool_work("pool-b", [other])
    assert memo.pool_work("pool-a", []) == {}
    kept = memo.pool_work("pool-b", [other])
    assert sorted(kept) == [work_key("x", 0)]
    # a batch of another pool (or not in progress) brings no work
    done = {**a, "status": {**a["status"], "status": "finalizing"}}
    assert memo.pool_work("pool-a", [other, done]) == {}
    memo.forget_pool("pool-b")
    assert memo.pool_work("pool-b", []) == {}
