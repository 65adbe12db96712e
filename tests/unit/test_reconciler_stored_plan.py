"""Issue #30, item 4: a batch whose plan is too long to list keeps it in the store; the status
lists the shards that run or failed and folds the succeeded ones, and every phase (placement,
progress, cancel, expiry, merge) still covers every shard."""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any

import pytest

from llmbatch.controller.batches import BatchReconciler
from llmbatch.controller.pools import PoolScheduler
from llmbatch.core import keys, shardbook
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"
REQUESTS = 40  # 20 shards of 2 (the pool's shardRequests): more than the status lists
SHARDS = REQUESTS // 2


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool())
    harness.kube.add("batchfiles", make_input_file(harness.store, FILE, REQUESTS))
    harness.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    return harness


def _ids(lines: list[dict[str, object]]) -> Counter[object]:
    return Counter(line["custom_id"] for line in lines)


def _run_to_completion(h: ReconcilerHarness) -> dict[str, Any]:
    """Run the slots and step the batch until it completed with every request."""
    for _ in range(10):
        if h.status(BATCH).get("status") != "in_progress":
            break
        h.run_jobs()
        h.step(BATCH)
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": REQUESTS, "completed": REQUESTS, "failed": 0}
    return status


def test_a_long_plan_is_stored_and_the_status_lists_only_live_shards(
    h: ReconcilerHarness,
) -> None:
    assert SHARDS > shardbook.LISTED_SHARDS
    status = h.step_until(BATCH, "in_progress")
    uid = h.batch(BATCH)["metadata"]["uid"]
    assert status["shardPlan"]["count"] == SHARDS
    assert status["shards"] == []  # every shard waits, none listed
    stored = shardbook.parse_plan(h.store.get(status["shardPlan"]["key"]))
    assert [s.request_count for s in stored] == [2] * SHARDS
    h.step(BATCH)
    for index in range(SHARDS):  # each waiting shard's spec is written for the pool round
        assert h.store.head(keys.shard_spec_key(TENANT, uid, index))
    h.pool_round()  # the round finds the unlisted shards and places them
    h.step(BATCH)
    listed = h.status(BATCH)["shards"]
    assert listed
    assert all(s["phase"] == "Running" and s["job"] for s in listed)
    status = _run_to_completion(h)
    assert _ids(h.file_lines(status["outputFileID"])) == Counter(
        f"req-{i}" for i in range(REQUESTS)
    )
    assert status["shards"] == []
    assert status["succeededShards"] == {
        "indexes": f"0-{SHARDS - 1}",
        "count": SHARDS,
        "preemptions": 0,
        "reruns": 0,
    }
    # the listed form of the same plan: ~190 bytes a shard; this one stays flat
    assert len(json.dumps(status)) < 2500, len(json.dumps(status))
    assert h.reasons().count("Completed") == 1


def test_cancel_writes_cancelled_lines_for_the_unlisted_shards(h: ReconcilerHarness) -> None:
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_shard(0)
    h.step(BATCH)
    assert h.status(BATCH)["succeededShards"]["indexes"] == "0"
    h.batch(BATCH)["spec"]["cancel"] = True
    status = h.step_until(BATCH, "cancelled")
    failed = REQUESTS - 2
    assert status["requestCounts"] == {"total": REQUESTS, "completed": 2, "failed": failed}
    errors = h.file_lines(status["errorFileID"])
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert _ids(h.file_lines(status["outputFileID"]) + errors) == Counter(
        f"req-{i}" for i in range(REQUESTS)
    )


def test_expiry_covers_the_shards_that_never_ran(h: ReconcilerHarness) -> None:
    h.step_until(BATCH, "in_progress")
    h.pool_round()
    h.now = h.status(BATCH)["expiresAt"] + 1
    status = h.step_until(BATCH, "expired")
    assert status["requestCounts"] == {"total": REQUESTS, "completed": 0, "failed": REQUESTS}
    errors = h.file_lines(status["errorFileID"])
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * REQUESTS
    assert _ids(errors) == Counter(f"req-{i}" for i in range(REQUESTS))


def test_a_finished_shards_progress_is_read_once(
    h: ReconcilerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # work follows change: a fold reads the records of the shards still running, not of the
    # ones whose final record it already read
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_shard(0)
    h.step(BATCH)  # folds shard 0's final record
    read: list[str] = []
    get = h.store.get

    def counting_get(key: str, *args: object, **kwargs: object) -> bytes:
        read.append(key)
        return get(key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(h.store, "get", counting_get)
    h.step(BATCH)
    h.step(BATCH)
    uid = h.batch(BATCH)["metadata"]["uid"]
    assert not [k for k in read if k.startswith(keys.shard_prefix(TENANT, uid, 0))]
    status = h.status(BATCH)
    assert status["requestCounts"]["completed"] == 2  # still counted


def test_an_operator_restarted_mid_run_finishes_every_shard_once(h: ReconcilerHarness) -> None:
    # a new operator holds no plan and no final records: it reads the plan again and rebuilds
    # the shards from the status and the leases (the store's), with nothing lost or run twice
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_shard(0)
    h.run_shard(1)
    h.step(BATCH)
    h.reconciler = BatchReconciler(h.kube, h.store, h.config, clock=h.clock)
    h.pools = PoolScheduler(h.kube, h.store, h.config, clock=h.clock, cpu_clock=h.clock)
    status = _run_to_completion(h)
    lines = h.file_lines(status["outputFileID"])
    assert _ids(lines) == Counter(f"req-{i}" for i in range(REQUESTS))  # each once
    assert status["succeededShards"]["count"] == SHARDS
