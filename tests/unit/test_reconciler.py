"""The batch reconciler's public behaviour, step by step, in seconds: validate → run → finalize,
cancel, expiry, shard failure, and the loss/liveness holes of issue #13 (a shard run that ends
"done" without every result, an input deleted while its batch runs, a pool deleted under its
batches).

The harness (tests/fixtures/reconciler.py) drives ``BatchReconciler.step`` and the pool
scheduler over one fake API, a real filesystem store and a test clock; shards run on warm slots
with the real slot loop and executor code.
"""

from __future__ import annotations

import pathlib
from collections import Counter

import pytest

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import ShardReport, SlotHeartbeat
from llmbatch.controller.batches.finalize import (
    CANCEL_RECHECK_SECONDS,
    FLUSH_RECHECK_SECONDS,
    recheck_seconds,
)
from llmbatch.controller.batches.step import BatchView
from llmbatch.core import keys
from llmbatch.storage.shardresults import ResultLine, ShardResults, list_chunks
from llmbatch.storage.slotchannel import SlotChannel
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool())
    return harness


def submit(h: ReconcilerHarness, requests: int = 5, **spec: object) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, FILE, requests))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE, **spec))


def custom_ids(lines: list[dict[str, object]]) -> Counter[object]:
    return Counter(line["custom_id"] for line in lines)


def test_validate_run_finalize(h: ReconcilerHarness) -> None:
    submit(h, requests=5)
    # One step takes a new batch through validation and writes its shard specs: each phase
    # runs on the status the previous one decided, not a timer tick later.
    h.step(BATCH)
    status = h.status(BATCH)
    assert status["status"] == "in_progress"
    assert [s["requestCount"] for s in status["shards"]] == [2, 2, 1]
    assert status["workerNamespace"] == "llmbatch-workers"
    assert [s["phase"] for s in status["shards"]] == ["Pending"] * 3  # they wait for a slot
    for index in range(3):
        assert h.store.head(keys.shard_spec_key(TENANT, h.batch(BATCH)["metadata"]["uid"], index))
    h.pool_round()  # one slot takes all three (slotConcurrency from max_num_seqs)
    (slot,) = h.jobs()
    h.step(BATCH)
    assert {s["job"] for s in h.status(BATCH)["shards"]} == {slot["metadata"]["name"]}
    assert [s["phase"] for s in h.status(BATCH)["shards"]] == ["Running"] * 3
    h.run_jobs()
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": 5, "completed": 5, "failed": 0}
    out = h.file_lines(status["outputFileID"])
    assert custom_ids(out) == Counter(f"req-{i}" for i in range(5))
    assert status.get("errorFileID") is None
    assert h.reasons()[:2] == ["Accepted", "Validated"]
    assert h.reasons()[-1] == "Completed"
    assert h.jobs() == []  # the slot exited when idle (idleSeconds: 0) and its Job is removed
    output = h.kube.get("batchfiles", TENANT, status["outputFileID"])
    assert output is not None
    labels = output["metadata"]["labels"]  # the recommended labels, as on every created object
    assert labels["app.kubernetes.io/instance"] == BATCH
    assert labels["app.kubernetes.io/component"] == "batch-results"
    assert labels["app.kubernetes.io/part-of"] == "llm-batch-operator"
    assert labels["app.kubernetes.io/managed-by"] == "llm-batch-operator"


def test_a_shard_seen_only_once_done_still_names_its_slot(h: ReconcilerHarness) -> None:
    # the batch's step may first see a shard's lease after its run ended (an operator restarted
    # while it ran lost the status patch that named the slot; or the grant and the end fell
    # between two steps): the lease remembers the slot that ran it, so the status still does
    submit(h, requests=5)
    h.step_until(BATCH, "in_progress")
    h.pool_round()  # granted
    (slot,) = h.jobs()
    h.run_jobs()  # run and settled done with no step of the batch in between
    status = h.step_until(BATCH, "completed")
    assert {s.get("job") for s in status["shards"]} == {slot["metadata"]["name"]}


def test_cancel_mid_run_keeps_finished_results(h: ReconcilerHarness) -> None:
    submit(h, requests=5)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_shard(0)
    h.step(BATCH)
    h.batch(BATCH)["spec"]["cancel"] = True
    status = h.step_until(BATCH, "cancelled")
    assert status["requestCounts"] == {"total": 5, "completed": 2, "failed": 3}
    errors = h.file_lines(status["errorFileID"])
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert custom_ids(h.file_lines(status["outputFileID"]) + errors) == Counter(
        f"req-{i}" for i in range(5)
    )
    # the shards still held by a slot got the cancel mark before their take-back (their
    # requests in the engine may finish); the one that had ended did not
    assert _cancel_marks(h) == [False, True, True]


def _cancel_marks(h: ReconcilerHarness) -> list[bool]:
    batch = h.batch(BATCH)
    ns, uid = batch["metadata"]["namespace"], batch["metadata"]["uid"]
    return [
        h.store.head(keys.shard_cancel_key(keys.shard_prefix(ns, uid, shard["index"]))) is not None
        for shard in h.status(BATCH)["shards"]
    ]


def test_expiry_writes_batch_expired_lines(h: ReconcilerHarness) -> None:
    submit(h, requests=3)
    h.step_until(BATCH, "in_progress")
    h.pool_round()  # granted: an expiry's take-back drains as any other, no cancel mark
    h.now = h.status(BATCH)["expiresAt"] + 1
    status = h.step_until(BATCH, "expired")
    assert not any(_cancel_marks(h))
    assert status["requestCounts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = h.file_lines(status["errorFileID"])
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 3


def test_failed_shard_becomes_shard_failed_lines_with_an_event(h: ReconcilerHarness) -> None:
    """A failed slot costs its shards an attempt, not a verdict: they go to a new slot; once a
    second slot failed under them they are presumed the cause and fail."""
    submit(h, requests=3)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    slots: set[str] = set()
    for _ in range(2):
        h.pool_round()
        for job in h.live_slots():
            slots.add(job["metadata"]["name"])
            h.finish_job(job, failed="BAD_CONFIG: engine refused its arguments")
        h.pool_round()
        h.step(BATCH)
        if len(slots) == 1:  # one failed slot: both shards wait for another, one attempt each
            assert {s["phase"] for s in h.status(BATCH)["shards"]} <= {"Pending", "Running"}
            assert [s["reruns"] for s in h.status(BATCH)["shards"]] == [1, 1]
    assert len(slots) == 2
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": 3, "completed": 0, "failed": 3}
    errors = h.file_lines(status["errorFileID"])
    assert {e["error"]["code"] for e in errors} == {"shard_failed"}
    assert "ShardFailed" in h.reasons()


def test_a_run_that_ends_done_without_every_result_is_rerun_not_reported_lost(
    h: ReconcilerHarness,
) -> None:
    # #13 hole 1, operator side: an executor reports done having lost a commit (progress says
    # done, one request has no result). Before, finalisation wrote it as a shard_failed line.
    submit(h, requests=2)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.pool_round()
    (slot,) = h.jobs()
    h.run_slot(slot, exits=False)
    uid = h.batch(BATCH)["metadata"]["uid"]
    prefix = keys.shard_prefix(TENANT, uid, 0)
    (chunk,) = list_chunks(h.store, prefix, "output")
    first, _ = h.store.get(chunk).splitlines(keepends=True)
    h.store.delete(chunk)
    # What the old executor left after its commit task died: one of two lines, done: true.
    lossy = ShardResults(h.store, prefix, batch_id="batch_x", shard_index=0)
    lossy.recover()
    lossy.commit({"output": [ResultLine("req-0", first, ok=True)]})
    lossy.write_progress(state="done", done=True)
    h.pool_round()  # the report says done; the progress record does not cover the shard
    h.step(BATCH)
    assert "ShardIncomplete" in h.reasons()
    assert h.status(BATCH)["shards"][0]["reruns"] == 1
    assert h.status(BATCH)["shards"][0]["phase"] == "Running"  # placed again at once
    h.run_jobs()  # re-granted; resumes from the chunk: runs only the missing request
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": 2, "completed": 2, "failed": 0}
    assert custom_ids(h.file_lines(status["outputFileID"])) == Counter(["req-0", "req-1"])


def _report_done_without_results(h: ReconcilerHarness) -> None:
    """Every slot says its shards are done while writing nothing (a broken executor)."""
    for job in h.live_slots():
        name = job["metadata"]["name"]
        channel = SlotChannel(h.store, keys.slot_prefix("pool-a", name))
        reports = [
            ShardReport(key=key, generation=a.generation, state="done")
            for key, a in channel.assignments().items()
        ]
        beat = SlotHeartbeat(slot=name, seq=int(h.now), state="ready", started_at=h.now)
        channel.write_heartbeat(beat.model_copy(update={"shards": reports}))


def test_rerun_gives_up_after_the_limit(h: ReconcilerHarness) -> None:
    submit(h, requests=1)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    for _ in range(4):  # backoffLimit 3: the fourth incomplete run fails the shard
        h.pool_round()
        _report_done_without_results(h)
        h.pool_round()
        h.step(BATCH)
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": 1, "completed": 0, "failed": 1}
    (line,) = h.file_lines(status["errorFileID"])
    assert line["error"]["code"] == "shard_failed"
    assert "gave up after 4 attempts" in line["error"]["message"]


def test_input_deleted_while_the_batch_runs_still_completes(h: ReconcilerHarness) -> None:
    # #13 hole 3: the user deletes the input file (bytes and BatchFile) after acceptance.
    submit(h, requests=3)
    h.step_until(BATCH, "in_progress")
    h.store.delete(keys.file_key(TENANT, FILE))
    h.kube.remove("batchfiles", TENANT, FILE)
    h.step(BATCH)
    h.run_jobs()
    status = h.step_until(BATCH, "completed")
    assert status["requestCounts"] == {"total": 3, "completed": 3, "failed": 0}


def test_input_deleted_before_the_merge_of_an_older_batch_ends_it(
    h: ReconcilerHarness,
) -> None:
    # A batch accepted before inputs were pinned reads the user's file at finalisation; when
    # those bytes are gone it must still end, publish what finished and say why.
    submit(h, requests=3)
    h.step_until(BATCH, "in_progress")
    status = h.status(BATCH)
    status["inputKey"] = keys.file_key(TENANT, FILE)  # as an older operator recorded it
    h.step(BATCH)
    h.run_shard(0)
    h.batch(BATCH)["spec"]["cancel"] = True
    h.store.delete(keys.file_key(TENANT, FILE))  # before the merge the cancel leads to
    status = h.step_until(BATCH, "cancelled")
    assert status["requestCounts"] == {"total": 3, "completed": 2, "failed": 1}
    assert [e["code"] for e in status["errors"]] == ["input_file_deleted"]
    assert "InputFileDeleted" in h.reasons()


def test_pool_deleted_with_the_batch_in_flight(h: ReconcilerHarness) -> None:
    # #13 hole 4: the batch must end with a clear error, settle, and leave no work behind.
    h.kube.add(
        "creditaccounts",
        {"metadata": {"name": "default", "namespace": TENANT}, "spec": {"limit": "100"}},
    )
    submit(h, requests=5)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_shard(0)
    h.step(BATCH)
    (slot,) = h.jobs()
    pool_uid = h.kube.get("batchpools", None, "pool-a")["metadata"]["uid"]
    # The slot Job belongs to its pool: the garbage collector deletes it with the pool.
    assert [o["uid"] for o in slot["metadata"]["ownerReferences"]] == [pool_uid]
    channel = SlotChannel(h.store, keys.slot_prefix("pool-a", slot["metadata"]["name"]))
    assert len(channel.assignments()) == 2
    h.kube.remove("batchpools", None, "pool-a")
    status = h.step_until(BATCH, "failed")
    assert status["requestCounts"] == {"total": 5, "completed": 2, "failed": 3}
    assert [e["code"] for e in status["errors"]] == ["pool_deleted"]
    errors = h.file_lines(status["errorFileID"])
    assert {e["error"]["code"] for e in errors} == {"pool_deleted"}
    assert "PoolDeleted" in h.reasons()
    assert channel.assignments() == {}  # taken back from the slot
    assert status["billing"]["settledAt"]
    account = h.kube.get("creditaccounts", TENANT, "default")
    assert account is not None
    assert account["status"]["reserved"] == "0.000000"


@pytest.mark.parametrize(
    ("spec", "tier"),
    [
        ({}, "standard"),
        ({"priority": "expedited"}, "expedited"),
        ({"metadata": {"tier": "flex"}}, "flex"),
    ],
)
def test_the_shard_specs_carry_the_batch_tier_to_the_engine(
    h: ReconcilerHarness, spec: dict[str, object], tier: str
) -> None:
    """The tier reaches the slot with each shard: its requests get the tier's engine priority."""
    submit(h, requests=3, **spec)
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)  # writes the shard specs
    uid = h.batch(BATCH)["metadata"]["uid"]
    for index in range(len(h.status(BATCH)["shards"])):
        raw = h.store.get(keys.shard_spec_key(TENANT, uid, index))
        assert ShardSpec.model_validate_json(raw).tier == tier


def test_running_batches_read_their_pool_once_an_interval(h: ReconcilerHarness) -> None:
    """Every step of a running batch needs its pool; the reconciler reads it from the API at
    most once per reconcile interval (a few hundred batches would otherwise read one object a
    hundred times a second), and sees an edit an interval later."""
    submit(h, requests=5)
    h.step(BATCH)  # validated, shard specs written
    h.kube.calls.clear()
    for _ in range(4):
        h.step(BATCH, advance=0.25)  # four steps within one 2 s interval
    reads = [c for c in h.kube.calls if c[:2] == ("get", "batchpools")]
    assert len(reads) <= 1
    h.now += h.config.reconcile_interval
    h.step(BATCH)
    assert len([c for c in h.kube.calls if c[:2] == ("get", "batchpools")]) == len(reads) + 1


def test_a_batch_whose_shards_all_ended_completes_in_one_step(h: ReconcilerHarness) -> None:
    """The step that sees every shard ended takes them back and merges at once, instead of
    leaving the merge to the next timer tick: the batch completes an interval sooner."""
    submit(h, requests=5)
    h.step(BATCH)
    h.pool_round()
    h.run_jobs()
    h.pool_round()  # the slot's end reports settled on the leases
    before = h.status(BATCH)["status"]
    h.step(BATCH)
    assert before == "in_progress"
    assert h.status(BATCH)["status"] == "completed"
    assert h.reasons()[-2:] == ["ShardsFinished", "Completed"]


@pytest.mark.parametrize(
    ("phase", "since", "expected"),
    [
        ("cancelling", 5, FLUSH_RECHECK_SECONDS),  # the first 30 s: every second
        ("cancelling", 40, CANCEL_RECHECK_SECONDS),  # a long cancel drain: every 5 s
        ("finalizing", 40, FLUSH_RECHECK_SECONDS),  # other take-backs drain seconds at most
    ],
)
def test_a_long_cancel_drain_is_looked_at_less_often(
    phase: str, since: int, expected: float
) -> None:
    body = make_batch(BATCH)
    body["metadata"]["uid"] = "u1"
    body["status"] = {"status": phase, "cancellingAt": 1000, "finalizingAt": 1000}
    assert recheck_seconds(BatchView.parse(body), 1000 + since) == expected
