"""Events of batches posted off the reconcile path (#30): a step hands its shards to the pool
without waiting for its Events, which follow in order; a full queue drops the oldest and counts
it; an Event cut short by a stop is posted by the next flush."""

from __future__ import annotations

import asyncio
import copy
import pathlib
import random
from typing import Any

import pytest

from llmbatch.controller import eventrecorder, metrics
from llmbatch.controller.batchwork import ADMISSIONS_QUIET, BatchWork
from llmbatch.controller.eventrecorder import EventRecorder
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness, work_of

BATCH = "batch-" + "d" * 24
INVOLVED = {"apiVersion": "v1", "kind": "Batch", "namespace": "team-a", "name": BATCH, "uid": "u"}


class GatedPoster:
    """Posts Events only while its gate is open; records what it posted."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.posted: list[str] = []
        self.started: list[str] = []

    async def post_event(
        self, involved: dict[str, str], reason: str, message: str, *, warning: bool, component: str
    ) -> bool:
        self.started.append(reason)
        await self.gate.wait()
        self.posted.append(reason)
        return True


def dropped() -> float:
    return metrics.REGISTRY.get_sample_value("llmbatch_events_dropped_total") or 0.0


def test_events_are_posted_in_the_order_recorded() -> None:
    async def go() -> list[str]:
        poster = GatedPoster()
        poster.gate.set()
        recorder = EventRecorder(poster, "test")
        for reason in ("Validated", "Completed", "Deleted"):
            recorder.record(INVOLVED, reason, "m", warning=False)
        await recorder.flush()
        assert recorder.pending == 0
        return poster.posted

    assert asyncio.run(go()) == ["Validated", "Completed", "Deleted"]


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    async def go() -> list[str]:
        poster = GatedPoster()
        poster.gate.set()
        recorder = EventRecorder(poster, "test", capacity=2)
        for reason in ("A", "B", "C"):
            recorder.record(INVOLVED, reason, "m", warning=False)
        await recorder.flush()
        return poster.posted

    before = dropped()
    assert asyncio.run(go()) == ["B", "C"]
    assert dropped() == before + 1


def test_an_event_cut_short_is_posted_by_the_next_flush() -> None:
    async def go() -> list[str]:
        poster = GatedPoster()
        recorder = EventRecorder(poster, "test")
        recorder.record(INVOLVED, "Validated", "m", warning=False)
        task = asyncio.create_task(recorder.run())
        while not poster.started:
            await asyncio.sleep(0)
        task.cancel()  # the operator stopping while the API server hangs
        with pytest.raises(asyncio.CancelledError):
            await task
        assert recorder.pending == 1
        poster.gate.set()
        await recorder.close()
        return poster.posted

    assert asyncio.run(go()) == ["Validated"]


def test_closing_waits_for_a_hung_api_server_only_so_long() -> None:
    async def go() -> int:
        recorder = EventRecorder(GatedPoster(), "test")  # its gate never opens
        recorder.record(INVOLVED, "Validated", "m", warning=False)
        await recorder.close(seconds=0.05)
        return recorder.pending

    assert asyncio.run(go()) == 1


def test_a_step_reaches_the_pool_before_its_events_are_posted(tmp_path: pathlib.Path) -> None:
    """The worker hands the batch's shards to the pool (``on_step``) and goes on while the
    Event waits for an API server that is slow to take it; the Event follows."""
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool())
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "d" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "d" * 32))
    poster = GatedPoster()
    stepped: list[str] = []

    async def go() -> None:
        work = BatchWork(
            h.reconciler,
            h.kube,  # type: ignore[arg-type]
            resync_seconds=600,
            startup_spread_seconds=60,
            on_step=lambda body, step, patch: stepped.append(str(step.phase)),
            clock=h.clock,
            rng=random.Random(0),
        )
        work.events.kube = poster
        stop = asyncio.Event()
        running = asyncio.create_task(work.run(1, stop))
        work.notice(copy.deepcopy(created))
        for _ in range(1000):
            if stepped:
                break
            await asyncio.sleep(0.001)
        h.now += ADMISSIONS_QUIET  # the Events' hold after an acceptance (see below)
        for _ in range(1000):
            if poster.started:
                break
            await asyncio.sleep(0.001)
        assert stepped == ["in_progress"]
        assert h.status(BATCH)["status"] == "in_progress"
        assert poster.started == ["Validated"]
        assert poster.posted == []  # the step did not wait for it
        poster.gate.set()
        stop.set()
        await running
        assert poster.posted == ["Validated"]

    asyncio.run(go())


def test_events_keep_the_involved_object(tmp_path: pathlib.Path) -> None:
    """What the recorder posts is the Event the step announced, on the batch it stepped."""
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool())
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "d" * 32, 3))
    created: dict[str, Any] = h.kube.add(
        "batches", make_batch(BATCH, input_file_id="file-" + "d" * 32)
    )
    work = work_of(h)
    work.notice(copy.deepcopy(created))
    asyncio.run(work.run_due())
    (event,) = [e for e in h.kube.events if e["reason"] == "Validated"]
    assert event["involvedObject"]["name"] == BATCH
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]
    assert work.events.pending == 0


def test_events_hold_back_while_new_batches_wait_and_go_once_they_are_accepted() -> None:
    """#30's burst: Events posted while batches waited to be accepted took the API server's
    time from the acceptances' status writes. They wait for the admissions, never longer than
    HOLD_SECONDS."""

    async def go() -> None:
        poster = GatedPoster()
        poster.gate.set()
        admissions = [True]
        now = [0.0]
        recorder = EventRecorder(
            poster, "test", yield_to=lambda: admissions[0], clock=lambda: now[0]
        )
        task = asyncio.create_task(recorder.run())
        recorder.record(INVOLVED, "Validated", "m", warning=False)
        await asyncio.sleep(0.2)
        assert poster.posted == []  # held while admissions wait
        admissions[0] = False
        await asyncio.sleep(0.2)
        assert poster.posted == ["Validated"]
        admissions[0] = True  # a burst that does not end: held at most HOLD_SECONDS
        recorder.record(INVOLVED, "Completed", "m", warning=False)
        await asyncio.sleep(0.2)
        assert poster.posted == ["Validated"]
        now[0] += eventrecorder.HOLD_SECONDS
        await asyncio.sleep(0.2)
        assert poster.posted == ["Validated", "Completed"]
        task.cancel()

    asyncio.run(go())


def test_events_hold_back_a_moment_after_the_last_new_batch_was_taken(
    tmp_path: pathlib.Path,
) -> None:
    """The shards of the batches just accepted are granted and start in the second after the
    last acceptance: the held Events wait for that too (``ADMISSIONS_QUIET``)."""

    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool())
    h.kube.add("batchfiles", make_input_file(h.store, "file-" + "d" * 32, 3))
    created = h.kube.add("batches", make_batch(BATCH, input_file_id="file-" + "d" * 32))
    work = work_of(h)
    assert work.events.yield_to is not None
    assert not work.events.yield_to()
    work.notice(copy.deepcopy(created))
    assert work.events.yield_to()  # a new batch waits
    asyncio.run(work.run_due())
    assert h.status(BATCH)["status"] == "in_progress"
    assert work.events.yield_to()  # taken a moment ago
    h.now += ADMISSIONS_QUIET
    assert not work.events.yield_to()
