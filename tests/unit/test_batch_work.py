"""Work driven by change (#30): the batch cache never goes back behind the operator's own write,
the watch's events map to priorities, and the work loop reconciles a batch only when something
about it changed — counted through the shared fake API."""

from __future__ import annotations

import asyncio
import copy
import pathlib
from typing import Any

import pytest

from llmbatch.api.resources import BATCH_FINALIZER
from llmbatch.controller.batchcache import KOPF_DIFFBASE, BatchCache, slim
from llmbatch.controller.batchwork import BatchWork, change_priority
from llmbatch.core import keys
from llmbatch.core.workqueue import Priority
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness, work_of

BATCH = "batch-" + "c" * 24


def body(rv: int, phase: str | None = None, **spec: Any) -> dict[str, Any]:
    status = {} if phase is None else {"status": phase}
    return {
        "metadata": {"uid": "u1", "name": BATCH, "namespace": "team-a", "resourceVersion": str(rv),
                     "generation": 1, "managedFields": [{"manager": "x"}],
                     "annotations": {KOPF_DIFFBASE: "{...}", "keep": "me"}},
        "spec": spec,
        "status": status,
    }  # fmt: skip


def test_the_cache_never_goes_back_behind_a_write() -> None:
    cache = BatchCache()
    assert cache.observe(body(5, "validating")) == (None, True)
    cache.put(body(7, "in_progress"))  # our own write, answered by the API server
    before, news = cache.observe(body(6, "validating"))  # the watch catching up
    assert not news
    assert before is not None
    assert before["status"]["status"] == "in_progress"
    assert cache.get("u1")["status"]["status"] == "in_progress"  # type: ignore[index]
    assert cache.observe(body(7, "in_progress"))[1] is False  # the echo of the write
    assert cache.observe(body(8, "in_progress", cancel=True))[1] is True


def test_cached_bodies_are_slim_copies() -> None:
    kept = slim(body(1))
    assert "managedFields" not in kept["metadata"]
    assert kept["metadata"]["annotations"] == {"keep": "me"}
    cache = BatchCache()
    cache.put(body(1))
    got = cache.get("u1")
    assert got is not None
    got["status"]["status"] = "changed"
    assert cache.get("u1")["status"] == {}  # type: ignore[index]


@pytest.mark.parametrize(
    ("before", "after", "initial", "expected"),
    [
        (None, body(1), False, Priority.ADMIT),
        (None, body(1, "validating"), False, Priority.ADMIT),
        (body(1, "in_progress"), body(2, "in_progress", cancel=True), False, Priority.URGENT),
        (None, body(1, "in_progress", cancel=True), True, Priority.URGENT),
        (body(1, "cancelling", cancel=True), body(2, "cancelling", cancel=True), False,
         Priority.SHARDS),
        (None, body(1, "in_progress"), True, Priority.RESYNC),
        (body(1, "in_progress"), body(2, "in_progress"), False, Priority.SHARDS),
        (None, body(1, "finalizing"), True, Priority.SHARDS),
        (None, body(1, "completed"), True, None),
        (body(1, "in_progress"), body(2, "completed"), False, None),
    ],
)  # fmt: skip
def test_watch_events_map_to_priorities(
    before: dict[str, Any] | None, after: dict[str, Any], initial: bool, expected: Priority | None
) -> None:
    assert change_priority(before, after, initial=initial) is expected


# --- the loop on the reconciler harness -----------------------------------------------------


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool())
    return harness


def drain(h: ReconcilerHarness, work: BatchWork) -> int:
    """Reconcile everything due now; the steps taken."""
    before = work.steps
    asyncio.run(work.run_due())
    return work.steps - before


def test_a_new_batch_is_taken_through_validation_in_one_step_and_then_left_alone(
    h: ReconcilerHarness,
) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    assert drain(h, work) == 1
    assert h.status(BATCH)["status"] == "in_progress"
    # accepted and validated in one step: one Event write, both messages
    ((reason, message),) = [(e["reason"], e["message"]) for e in h.kube.events]
    assert reason == "Validated"
    assert message.startswith(f"Batch {BATCH.replace('batch-', 'batch_')} accepted; validating; ")
    # the watch shows our own write: an echo, no work
    work.notice(copy.deepcopy(h.batch(BATCH)))
    calls = len(h.kube.calls)
    h.now += 60
    assert drain(h, work) == 0
    assert len(h.kube.calls) == calls  # nothing happened, nothing was called
    # ... until its resync comes
    h.now += 1000
    assert drain(h, work) == 1


def test_a_stale_body_from_the_watch_is_never_stepped_on(h: ReconcilerHarness) -> None:
    """#30: the body kopf last saw was older than the operator's own last write, and a timer
    step on it re-validated the batch (a new Accepted and Validated Event each time)."""
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    drain(h, work)
    accepted = [e for e in h.kube.events if "accepted" in e["message"]]
    assert len(accepted) == 1
    work.notice(copy.deepcopy(created))  # the watch lagging: the object as it was created
    h.now += 1
    assert drain(h, work) == 0
    assert [e for e in h.kube.events if "accepted" in e["message"]] == accepted


def test_a_step_on_a_body_changed_meanwhile_is_refused_and_taken_again(
    h: ReconcilerHarness,
) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    stored = h.kube.get("batches", "team-a", BATCH)
    assert stored is not None
    stored["metadata"]["annotations"] = {"someone": "else"}
    stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 5)
    drain(h, work)  # refused (409), read again, stepped again
    assert h.status(BATCH)["status"] == "in_progress"
    assert len([e for e in h.kube.events if "accepted" in e["message"]]) == 1


def test_the_pool_round_tells_the_batch_its_shards_changed_and_nothing_else_steps_it(
    h: ReconcilerHarness,
) -> None:
    """A batch is reconciled when the pool round grants or ends one of its shards; between
    those changes it is left alone."""
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    h.pools.on_shards_changed = work.push
    work.notice(copy.deepcopy(created))
    assert drain(h, work) == 1  # accepted, shard specs written
    h.pool_round()  # granted to a new slot: the round tells the batch
    assert drain(h, work) == 1
    assert {s["phase"] for s in h.status(BATCH)["shards"]} == {"Running"}
    h.now += 1
    assert drain(h, work) == 0  # nothing changed
    (job,) = h.jobs()
    h.run_slot(job)  # the slot runs the shards and exits
    h.pool_round()  # their ends settled: the round tells the batch
    drain(h, work)
    assert h.status(BATCH)["status"] == "completed"
    h.now += 10_000
    assert drain(h, work) == 0  # a finished batch is never stepped again


def test_a_failed_reconcile_is_retried_after_a_backoff(h: ReconcilerHarness) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    calls: list[int] = []
    real = work.reconciler.step

    async def flaky(body: dict[str, Any]) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the store is down")
        return await real(body)

    work.reconciler.step = flaky  # type: ignore[method-assign]
    assert drain(h, work) == 0  # failed: not counted as a step, queued after a backoff
    assert h.status(BATCH) == {}
    h.now += 1
    drain(h, work)
    assert h.status(BATCH)["status"] == "in_progress"


def test_a_pool_deleted_under_its_batches_makes_them_step(h: ReconcilerHarness) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    drain(h, work)
    h.kube.remove("batchpools", None, "pool-a")
    work.push_pool("pool-a", after=h.config.reconcile_interval + 0.5)
    h.now += h.config.reconcile_interval + 1
    drain(h, work)
    assert h.status(BATCH)["status"] == "failed"


# --- the operator's finalizer --------------------------------------------------------------------


def test_a_batch_created_without_the_finalizer_gets_it_once_one_created_with_it_no_write(
    h: ReconcilerHarness,
) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    bare = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    held = make_batch("batch-" + "d" * 24, input_file_id="file-" + "c" * 32)
    held["metadata"]["finalizers"] = [BATCH_FINALIZER]  # as the gateway creates it
    held = h.kube.add("batches", held)
    work = work_of(h)
    work.notice(copy.deepcopy(bare))
    work.notice(copy.deepcopy(held))
    assert drain(h, work) == 2
    assert h.batch(BATCH)["metadata"]["finalizers"] == [BATCH_FINALIZER]
    patched = [c[2] for c in h.kube.calls if c[:2] == ("patch", "batches")]
    assert patched == [BATCH]  # the bare one only, once
    assert h.status(BATCH)["status"] == h.status("batch-" + "d" * 24)["status"] == "in_progress"


@pytest.mark.parametrize("finished", [False, True])
def test_a_batch_marked_for_deletion_is_cleaned_up_then_let_go(
    h: ReconcilerHarness, finished: bool
) -> None:
    """The cleanup runs whatever the phase (a finished batch's result bytes go too), then the
    finalizer goes and the API server removes the object; its late echo costs nothing."""
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "c" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "c" * 32))
    work = work_of(h)
    h.pools.on_shards_changed = work.push
    work.notice(copy.deepcopy(created))
    drain(h, work)
    uid = created["metadata"]["uid"]
    if finished:
        h.pool_round()
        drain(h, work)
        (job,) = h.jobs()
        h.run_slot(job)
        h.pool_round()
        drain(h, work)
        assert h.status(BATCH)["status"] == "completed"
    work_area = keys.work_prefix(TENANT, uid) + "/"
    assert list(h.store.list(work_area))
    asyncio.run(h.kube.delete_custom("batches", TENANT, BATCH))
    marked = copy.deepcopy(h.batch(BATCH))
    assert marked["metadata"]["deletionTimestamp"]
    work.notice(marked)
    assert change_priority(None, marked, initial=False) is Priority.URGENT
    drain(h, work)
    assert h.kube.get("batches", TENANT, BATCH) is None  # let go: the API server removed it
    assert list(h.store.list(work_area)) == []
    echo = copy.deepcopy(marked)
    echo["metadata"]["finalizers"] = []
    echo["metadata"]["resourceVersion"] = str(int(marked["metadata"]["resourceVersion"]) + 1)
    work.notice(echo)  # the watch's late MODIFIED of the object going away
    calls = len(h.kube.calls)
    assert drain(h, work) == 0
    assert len(h.kube.calls) == calls


def test_a_flood_of_one_tenants_flex_creates_does_not_delay_anothers_expedited_completion(
    h: ReconcilerHarness,
) -> None:
    """One tenant's expedited batch runs; meanwhile another tenant creates 100 flex batches.
    When its shards end, its finalisation is the next step the operator takes, not the 101st
    (counted in steps, not seconds)."""
    other, flood = "team-flood", 100
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "e" * 32, 2))
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "f" * 32, 2, namespace=other))
    work = work_of(h)
    h.pools.on_shards_changed = work.push
    order: list[tuple[str, str | None]] = []
    work.on_step = lambda body, step, _: order.append((body["metadata"]["name"], step.phase))
    expedited = h.kube.add(
        "batches", make_batch(BATCH, input_file_id="file-" + "e" * 32, priority="expedited")
    )
    work.notice(copy.deepcopy(expedited))
    drain(h, work)
    h.pool_round()
    drain(h, work)
    (job,) = h.jobs()
    h.run_slot(job)  # its shards ran; the operator has not seen them end yet
    for i in range(flood):
        created = h.kube.add(
            "batches",
            make_batch(f"batch-{i:024x}", namespace=other, input_file_id="file-" + "f" * 32,
                       metadata={"tier": "flex"}),
        )  # fmt: skip
        work.notice(copy.deepcopy(created))
    order.clear()
    h.pool_round()  # the ends settled: the round tells the expedited batch
    drain(h, work)
    assert h.status(BATCH)["status"] == "completed"
    names = [name for name, _ in order]
    assert names.index(BATCH) == 0
    assert len(names) == flood + 1
