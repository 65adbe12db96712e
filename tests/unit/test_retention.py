"""Retention rules (llmbatch.core.retention): what is due at each clock, nothing in use is due."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from llmbatch.api.resources import PoolRetention
from llmbatch.core import keys
from llmbatch.core.retention import (
    DAY,
    HOUR,
    SETTLE_SECONDS,
    BatchRef,
    RetentionPolicy,
    StoredFile,
    batch_archive_due,
    batch_leaves_at,
    decide_file,
    output_expires_at,
    plan_retention,
    work_area_due,
)

T0 = 1_800_000_000
NS = "team-a"
DEFAULT = RetentionPolicy()


def stored(
    name: str = "file-in",
    *,
    purpose: str = "batch",
    created: int = T0,
    expires: int | None = None,
    shown: int | None = None,
    namespace: str = NS,
) -> StoredFile:
    return StoredFile(
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        purpose=purpose,
        storage_key=f"files/{namespace}/{name}",
        bytes=10,
        created_at=created,
        requested_expires_at=expires,
        shown_expires_at=shown,
        used_by=(),
    )


def batch(
    name: str = "batch-b1",
    *,
    phase: str | None = "in_progress",
    input_file: str | None = "file-in",
    accepted: int | None = T0 + 60,
    window_end: int | None = T0 + 60 + DAY,
    finished: int | None = None,
    pool: str | None = "pool-a",
    results: tuple[str, ...] = (),
    work_removed: bool = False,
    namespace: str = NS,
) -> BatchRef:
    return BatchRef(
        namespace=namespace,
        name=name,
        uid=f"uid-{name}",
        phase=phase,
        input_file_id=input_file,
        result_file_ids=results,
        accepted_at=accepted,
        window_end=window_end,
        finished_at=finished,
        pool=pool,
        work_removed=work_removed,
    )


def due_at(file: StoredFile, refs: list[BatchRef], now: float, **pools: PoolRetention) -> bool:
    policies = {name: DEFAULT.for_pool(p) for name, p in pools.items()}
    decision = decide_file(file, refs, DEFAULT, policies, now)
    assert decision is not None
    return decision.due


# --- inputs no batch accepted ------------------------------------------------------------------


def test_unused_input_expires_24h_after_upload() -> None:
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [], T0 + DAY - 1)
    assert due_at(f, [], T0 + DAY)
    decision = decide_file(f, [], DEFAULT, {}, T0)
    assert decision is not None
    assert (decision.rule, decision.expires_at) == ("unused_input", T0 + DAY)
    assert not decision.status_stale  # spec.expiresAt already shows it: no status patch


def test_an_input_may_ask_for_less_but_never_for_more() -> None:
    assert due_at(stored(expires=T0 + 5), [], T0 + 5)
    longer = stored(expires=T0 + 3 * DAY)
    assert not due_at(longer, [], T0 + DAY - 1)
    assert due_at(longer, [], T0 + DAY)
    decision = decide_file(longer, [], DEFAULT, {}, T0)
    assert decision is not None
    assert decision.status_stale


def test_a_validating_batch_keeps_an_old_unused_input() -> None:
    validating = batch(phase="validating", accepted=None)
    assert not due_at(stored(expires=T0 + DAY), [validating], T0 + 10 * DAY)
    never_seen = batch(phase=None, accepted=None)  # created, no status yet
    assert not due_at(stored(expires=T0 + DAY), [never_seen], T0 + 10 * DAY)


def test_an_input_whose_batch_failed_validation_keeps_its_upload_schedule() -> None:
    failed = batch(phase="failed", accepted=None, finished=T0 + 100)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [failed], T0 + DAY - 1)  # the client may fix the cause and resubmit it
    assert due_at(f, [failed], T0 + DAY)


# --- accepted inputs ---------------------------------------------------------------------------


def test_accepted_input_goes_once_its_batch_finished() -> None:
    done = batch(phase="completed", finished=T0 + 2 * HOUR)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [done], T0 + 2 * HOUR + SETTLE_SECONDS - 1)
    assert due_at(f, [done], T0 + 2 * HOUR + SETTLE_SECONDS)
    decision = decide_file(f, [done], DEFAULT, {}, T0)
    assert decision is not None
    assert decision.rule == "accepted_input"
    assert decision.used_by == ("batch_b1",)


def test_a_running_batch_keeps_its_input_past_every_clock() -> None:
    running = batch(phase="in_progress")
    f = stored(expires=T0 + DAY)
    for now in (T0 + DAY, T0 + 2 * DAY + 61, T0 + 30 * DAY):
        assert not due_at(f, [running], now)
    decision = decide_file(f, [running], DEFAULT, {}, T0 + DAY)
    assert decision is not None
    assert decision.in_use
    assert decision.expires_at == T0 + 60 + 2 * DAY  # the 48 h bound (the window ends before)
    for phase in ("finalizing", "cancelling", "validating"):
        assert not due_at(f, [batch(phase=phase)], T0 + 30 * DAY)


def test_a_flex_batch_past_the_48h_bound_keeps_its_input_until_it_ends() -> None:
    window_end = T0 + 60 + 72 * HOUR
    flex = batch(phase="in_progress", window_end=window_end)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [flex], T0 + 60 + 2 * DAY + 1)
    decision = decide_file(f, [flex], DEFAULT, {}, T0)
    assert decision is not None
    assert decision.expires_at == window_end
    ended = batch(phase="expired", window_end=window_end, finished=window_end + 120)
    assert not due_at(f, [ended], window_end + 120 + SETTLE_SECONDS - 1)
    assert due_at(f, [ended], window_end + 120 + SETTLE_SECONDS)


def test_the_48h_bound_after_acceptance_caps_a_grace_after_the_batch() -> None:
    slow_release = PoolRetention(input_after_batch_seconds=5 * DAY)
    done = batch(phase="completed", finished=T0 + HOUR)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [done], T0 + 60 + 2 * DAY - 1, **{"pool-a": slow_release})
    assert due_at(f, [done], T0 + 60 + 2 * DAY, **{"pool-a": slow_release})
    short = PoolRetention(input_after_batch_seconds=600)
    assert not due_at(f, [done], T0 + HOUR + 599, **{"pool-a": short})
    assert due_at(f, [done], T0 + HOUR + 600, **{"pool-a": short})


def test_pool_settings_shorten_the_acceptance_bound() -> None:
    tight = PoolRetention(accepted_input_seconds=HOUR, input_after_batch_seconds=DAY)
    done = batch(phase="completed", finished=T0 + 120)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [done], T0 + 60 + HOUR - 1, **{"pool-a": tight})
    assert due_at(f, [done], T0 + 60 + HOUR, **{"pool-a": tight})
    # A batch on another pool keeps the defaults: no grace after the batch.
    assert not due_at(f, [done], T0 + 120 + SETTLE_SECONDS - 1, **{"pool-b": tight})
    assert due_at(f, [done], T0 + 120 + SETTLE_SECONDS, **{"pool-b": tight})


def test_an_input_two_batches_use_is_kept_while_either_runs() -> None:
    done = batch("batch-b1", phase="completed", finished=T0 + HOUR)
    running = batch("batch-b2", phase="in_progress", accepted=T0 + 2 * HOUR)
    f = stored(expires=T0 + DAY)
    assert not due_at(f, [done, running], T0 + 3 * DAY)
    second_done = batch(
        "batch-b2", phase="cancelled", accepted=T0 + 2 * HOUR, finished=T0 + 3 * DAY
    )
    assert due_at(f, [done, second_done], T0 + 3 * DAY + SETTLE_SECONDS)
    decision = decide_file(f, [done, second_done], DEFAULT, {}, T0)
    assert decision is not None
    assert decision.used_by == ("batch_b1", "batch_b2")


def test_a_batch_in_another_namespace_protects_nothing() -> None:
    elsewhere = batch(phase="in_progress", namespace="team-b")
    f = stored(expires=T0 + 5)
    plan = plan_retention([f], [elsewhere], DEFAULT, {}, T0 + 10)
    assert [d.file.name for d in plan.delete] == ["file-in"]


# --- outputs -----------------------------------------------------------------------------------


def test_output_expires_when_its_file_says() -> None:
    owner = batch(phase="completed", finished=T0, results=("file-out",), input_file=None)
    out = stored("file-out", purpose="batch_output", expires=T0 + 7 * DAY)
    assert not due_at(out, [owner], T0 + 7 * DAY - 1)
    assert due_at(out, [owner], T0 + 7 * DAY)
    without = stored("file-out", purpose="batch_output")
    assert due_at(without, [], T0 + 7 * DAY)
    assert not due_at(without, [], T0 + 7 * DAY - 1)


def test_an_output_a_non_terminal_batch_references_is_kept() -> None:
    owner = batch(phase="finalizing", results=("file-out",), input_file=None)
    out = stored("file-out", purpose="batch_output", expires=T0 + 5)
    assert not due_at(out, [owner], T0 + 30 * DAY)


def test_output_lifetime_batch_then_pool_then_default() -> None:
    pool = PoolRetention(output_seconds=HOUR)
    assert output_expires_at(T0, None, None, DEFAULT) == T0 + 7 * DAY
    assert output_expires_at(T0, None, pool, DEFAULT) == T0 + HOUR
    assert output_expires_at(T0, 2 * DAY, pool, DEFAULT) == T0 + 2 * DAY
    assert output_expires_at(T0, None, PoolRetention(), DEFAULT) == T0 + 7 * DAY


def test_pool_override_keeps_unset_fields_and_an_explicit_zero() -> None:
    base = RetentionPolicy(input_after_batch_seconds=600)
    merged = base.for_pool(PoolRetention(input_after_batch_seconds=0))
    assert merged.input_after_batch_seconds == 0
    assert merged.accepted_input_seconds == base.accepted_input_seconds
    assert base.for_pool(None) is base


def test_unknown_purpose_is_never_touched() -> None:
    odd = stored(purpose="assistants", expires=T0)
    assert decide_file(odd, [], DEFAULT, {}, T0 + 30 * DAY) is None
    assert not plan_retention([odd], [], DEFAULT, {}, T0 + 30 * DAY).delete


# --- work areas --------------------------------------------------------------------------------


def test_work_area_goes_once_after_the_batch_finished() -> None:
    done = batch(phase="completed", finished=T0)
    assert not work_area_due(done, T0 + SETTLE_SECONDS - 1)
    assert work_area_due(done, T0 + SETTLE_SECONDS)
    marked = batch(phase="completed", finished=T0, work_removed=True)
    assert not work_area_due(marked, T0 + DAY)
    for phase in (None, "validating", "in_progress", "finalizing", "cancelling"):
        assert not work_area_due(batch(phase=phase), T0 + 30 * DAY)


# --- a whole sweep -----------------------------------------------------------------------------


def _apply(
    plan: Any, files: list[StoredFile], batches: list[BatchRef]
) -> tuple[list[StoredFile], list[BatchRef]]:
    """What the operator's sweep does with a plan, on the listed facts."""
    gone = {(d.file.namespace, d.file.name) for d in plan.delete}
    published = {(d.file.namespace, d.file.name): d for d in plan.publish}
    kept = []
    for f in files:
        if (f.namespace, f.name) in gone:
            continue
        d = published.get((f.namespace, f.name))
        if d is not None:
            f = StoredFile(**{**f.__dict__, "shown_expires_at": d.expires_at, "used_by": d.used_by})
        kept.append(f)
    cleaned = {b.uid for b in plan.clean_work}
    marked = [
        BatchRef(**{**b.__dict__, "work_removed": b.work_removed or b.uid in cleaned})
        for b in batches
    ]
    return kept, marked


@pytest.mark.parametrize("hours", [0, 12, 24, 25, 49, 24 * 8])
def test_a_sweep_deletes_exactly_what_is_due_and_a_second_is_a_no_op(hours: int) -> None:
    now = T0 + hours * HOUR + 1
    files = [
        stored("file-unused", expires=T0 + DAY),
        stored("file-running", expires=T0 + DAY),
        stored("file-done", expires=T0 + DAY),
        stored("file-out", purpose="batch_output", expires=T0 + 2 * HOUR + 7 * DAY),
    ]
    batches = [
        batch("batch-run", input_file="file-running", window_end=T0 + 30 * DAY),
        batch(
            "batch-done",
            phase="completed",
            input_file="file-done",
            finished=T0 + 2 * HOUR,
            results=("file-out",),
        ),
    ]
    plan = plan_retention(files, batches, DEFAULT, {}, now)
    deleted = {d.file.name for d in plan.delete}
    expected = set()
    if now >= T0 + DAY:
        expected.add("file-unused")
    if now >= T0 + 2 * HOUR + SETTLE_SECONDS:
        expected.add("file-done")
    if now >= T0 + 2 * HOUR + 7 * DAY:
        expected.add("file-out")
    assert deleted == expected
    assert "file-running" not in deleted
    assert [b.name for b in plan.clean_work] == (["batch-done"] if hours >= 1 else [])
    files, batches = _apply(plan, files, batches)
    again = plan_retention(files, batches, DEFAULT, {}, now)
    assert (again.delete, again.publish, again.clean_work) == ([], [], [])


# --- reading the objects -----------------------------------------------------------------------


def test_batch_ref_reads_acceptance_and_finish_from_status() -> None:
    obj: dict[str, Any] = {
        "metadata": {"namespace": NS, "name": "batch-x", "uid": "u"},
        "spec": {"inputFileID": "file-in"},
        "status": {
            "status": "cancelled",
            "inProgressAt": T0,
            "inputKey": "files/team-a/file-in",
            "cancelledAt": T0 + 5,
            "completedAt": T0 + 9,
            "outputFileID": "file-out",
            "pool": "p",
        },
    }
    ref = BatchRef.from_object(obj)
    assert (ref.accepted_at, ref.finished_at, ref.result_file_ids) == (T0, T0 + 5, ("file-out",))
    assert not ref.active
    assert ref.batch_id == "batch_x"
    del obj["status"]["inputKey"]  # not validated by the operator: not an acceptance
    assert BatchRef.from_object(obj).accepted_at is None
    assert BatchRef.from_object({"metadata": {"name": "batch-y"}}).active


def test_stored_file_falls_back_to_the_creation_timestamp() -> None:
    f = StoredFile.from_object(
        {
            "metadata": {
                "namespace": NS,
                "name": "file-z",
                "creationTimestamp": "2027-01-15T08:00:00Z",
            },
            "spec": {"purpose": "batch", "storageKey": "files/team-a/file-z", "bytes": 3},
            "status": {"expiresAt": 7, "usedBy": ["batch_q"]},
        }
    )
    assert f.created_at == 1800000000
    assert (f.shown_expires_at, f.used_by, f.requested_expires_at) == (7, ("batch_q",), None)


def test_a_batch_name_without_the_prefix_does_not_stop_the_sweep() -> None:
    ref = BatchRef.from_object(
        {
            "metadata": {"name": "my-job", "namespace": "team-a", "uid": "u"},
            "spec": {"inputFileID": "file-1"},
            "status": {"status": "completed"},
        }
    )
    assert ref.batch_id == "my-job"


# --- a lifetime the uploader chose (expires_after) ---------------------------------------------


def asked(lifetime: int, **kwargs: Any) -> StoredFile:
    f = stored(expires=T0 + lifetime, **kwargs)
    return StoredFile(**{**f.__dict__, "requested_lifetime": lifetime})


def test_expires_after_replaces_the_24h_default_longer_or_shorter() -> None:
    short = asked(HOUR)
    assert not due_at(short, [], T0 + HOUR - 1)
    assert due_at(short, [], T0 + HOUR)
    long = asked(3 * DAY)
    assert not due_at(long, [], T0 + 3 * DAY - 1)
    assert due_at(long, [], T0 + 3 * DAY)
    decision = decide_file(long, [], DEFAULT, {}, T0)
    assert decision is not None
    assert (decision.rule, decision.expires_at) == ("unused_input", T0 + 3 * DAY)
    assert not decision.status_stale  # spec.expiresAt already shows it


def test_expires_after_is_read_from_the_batchfile() -> None:
    obj = {
        "metadata": {"name": "file-a", "namespace": NS, "uid": "u"},
        "spec": {"purpose": "batch", "createdAt": T0, "expiresAt": T0 + 7200},
    }
    assert StoredFile.from_object(obj).requested_lifetime is None
    obj["spec"]["expiresAfterSeconds"] = 7200
    assert StoredFile.from_object(obj).asked_expiry == T0 + 7200


def test_expires_after_never_deletes_an_input_in_use_and_caps_the_grace_after() -> None:
    f = asked(2 * HOUR)
    running = batch(accepted=T0 + 60)
    assert not due_at(f, [running], T0 + 3 * HOUR)
    done = batch(phase="completed", accepted=T0 + 60, finished=T0 + 3 * HOUR)
    assert due_at(f, [done], T0 + 3 * HOUR + SETTLE_SECONDS)
    grace = PoolRetention(input_after_batch_seconds=DAY)
    early = batch(phase="completed", accepted=T0 + 60, finished=T0 + HOUR)
    assert not due_at(f, [early], T0 + 2 * HOUR - 1, **{"pool-a": grace})
    assert due_at(f, [early], T0 + 2 * HOUR, **{"pool-a": grace})  # not the pool's 24 h grace


# --- staged inline inputs ----------------------------------------------------------------------


def test_a_staged_inline_input_without_its_batch_is_unclaimed() -> None:
    """The gateway stages inline requests under ``inline/<namespace>/<batch id>.jsonl`` before it
    creates the Batch; one whose Batch does not exist (create failed, or deleted unvalidated) is
    unclaimed. Keys that are not a batch's are never touched."""
    claimed = keys.inline_staging_key(NS, "batch_b1")
    elsewhere = keys.inline_staging_key("team-b", "batch_b1")  # same id, other namespace
    orphan = keys.inline_staging_key(NS, "batch_gone")
    strange = [f"{keys.INLINE_STAGING_PREFIX}{NS}/notes.txt", f"{keys.INLINE_STAGING_PREFIX}x"]
    staged = [claimed, elsewhere, orphan, *strange]
    plan = plan_retention([], [batch("batch-b1", phase=None)], DEFAULT, {}, T0, staged)
    assert sorted(plan.unclaimed) == sorted([elsewhere, orphan])
    rejected = batch("batch-b1", phase="failed", finished=T0)  # failed validation: never reads it
    plan = plan_retention([], [rejected], DEFAULT, {}, T0, staged)
    assert sorted(plan.unclaimed) == sorted([claimed, elsewhere, orphan])


# --- finished Batch objects leave the API server for the archive --------------------------------


def test_a_finished_batch_leaves_when_its_results_expire_unless_told_otherwise() -> None:
    done = replace(batch(phase="completed", finished=T0), work_removed=True)
    assert batch_leaves_at(done, DEFAULT) == T0 + 7 * DAY
    own = replace(done, output_seconds=3600)  # the client's output_expires_after
    assert batch_leaves_at(own, DEFAULT) == T0 + 3600
    assert batch_leaves_at(own, RetentionPolicy(batch_seconds=60)) == T0 + 60
    pool = DEFAULT.for_pool(PoolRetention(batch_seconds=0))
    assert batch_leaves_at(done, pool) == T0
    assert not batch_archive_due(done, DEFAULT, T0 + 7 * DAY - 1)
    assert batch_archive_due(done, DEFAULT, T0 + 7 * DAY)
    assert batch_leaves_at(batch(phase="in_progress"), DEFAULT) is None


def test_a_batch_stays_while_it_runs_its_work_area_remains_or_a_webhook_is_pending() -> None:
    later = T0 + 365 * DAY
    for phase in (None, "validating", "in_progress", "finalizing", "cancelling"):
        assert not batch_archive_due(replace(batch(phase=phase), work_removed=True), DEFAULT, later)
    done = batch(phase="failed", finished=T0)
    assert not batch_archive_due(done, DEFAULT, later)  # its work area first
    waiting = replace(done, work_removed=True, webhooks_pending=True)
    assert not batch_archive_due(waiting, DEFAULT, later)
    half = replace(done, work_removed=True, archived=True)  # a sweep cut short: finish it
    assert batch_archive_due(half, DEFAULT, T0)


def test_batch_ref_reads_the_archive_and_webhook_annotations() -> None:
    delivery = {
        "webhook": "w",
        "webhookUid": "u1",
        "webhookId": "wh_1",
        "state": "Pending",
        "attempts": 1,
        "plannedAt": T0,
        "nextAttemptAt": T0 + 60,
    }
    pending = {"type": "batch.completed", "eventId": "evt_1", "createdAt": T0}
    pending["deliveries"] = [delivery]
    obj: dict[str, Any] = {
        "metadata": {
            "name": "batch-b1",
            "namespace": NS,
            "uid": "u",
            "annotations": {
                keys.ANNOTATION_ARCHIVED: "archive/team-a/batch_b1.json",
                "llmbatch.io/webhook-deliveries": json.dumps(pending),
            },
        },
        "spec": {"outputExpiresAfterSeconds": 7200},
        "status": {"status": "completed", "completedAt": T0},
    }
    ref = BatchRef.from_object(obj)
    assert (ref.archived, ref.output_seconds) == (True, 7200)
    assert ref.webhooks_pending
    obj["metadata"]["annotations"]["llmbatch.io/webhook-deliveries"] = "{not json"
    assert not BatchRef.from_object(obj).webhooks_pending
