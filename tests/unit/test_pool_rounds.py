"""When pool rounds run and what they send, with the reconciler harness: a batch's kick ends the
wait for a round at once; a round computes from the status the previous round computed (the
watch lags behind back-to-back rounds) and holds back a patch that only reports; a round reuses
its pool's slot Job listing for a moment under a burst, and lists again after the operator
created or deleted a slot Job."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from llmbatch.controller.pools import (
    LATEST_SECONDS,
    QUIET_SECONDS,
    REPORT_SECONDS,
    ROUND_PACE,
    PoolRound,
    running_entry,
)
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness


def harness(tmp_path: pathlib.Path, **spec: Any) -> ReconcilerHarness:
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool(scaleDownCooldownSeconds=0, **spec))
    return h


def submit(h: ReconcilerHarness, name: str, requests: int) -> str:
    file_id = f"file-{name[-32:]:0>32}"
    h.kube.add("batchfiles", make_input_file(h.store, file_id, requests))
    h.kube.add("batches", make_batch(name, input_file_id=file_id))
    h.step_until(name, "in_progress")
    h.step(name)  # the shard specs: queued
    return name


def desired_events(result: PoolRound) -> list[str]:
    return [message for _, reason, message in result.events if reason == "DesiredSlots"]


# --- waking up -------------------------------------------------------------------------------


def test_a_kick_ends_the_wait_for_a_round_at_once(tmp_path: pathlib.Path) -> None:
    """The pool timer waits in ``wait_due``: a batch accepted meanwhile (its kick) starts the
    round then, not at the end of the wait."""
    h = harness(tmp_path)
    h.pool_round()  # the last round: the next one is an interval away

    async def go() -> tuple[bool, bool]:
        waiting = asyncio.create_task(h.pools.wait_due("pool-a", 30.0))
        await asyncio.sleep(0.05)
        before = waiting.done()
        h.pools.kick("pool-a")
        return before, await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(go()) == (False, True)


def test_the_wait_ends_undue_at_its_limit_or_when_the_operator_stops(
    tmp_path: pathlib.Path,
) -> None:
    h = harness(tmp_path)
    h.pool_round()

    async def go() -> tuple[bool, bool]:
        limited = await asyncio.wait_for(h.pools.wait_due("pool-a", 0.05), 1.0)
        stop = asyncio.Event()
        waiting = asyncio.create_task(h.pools.wait_due("pool-a", 30.0, stop.wait))
        await asyncio.sleep(0.05)
        stop.set()
        return limited, await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(go()) == (False, False)


# --- status ----------------------------------------------------------------------------------


def test_a_round_computes_from_the_status_the_last_round_computed(tmp_path: pathlib.Path) -> None:
    """Two rounds back to back, the second before the watch shows the first one's patch: it
    scales from what the first decided (no second "Desired slots" step, no Event twice) and
    sends the patch again, since the pool does not show it."""
    h = harness(tmp_path, minSlots=0)
    submit(h, "batch-" + "a" * 24, requests=2)
    first = asyncio.run(h.pool_step())  # not merged into the pool: the body lags
    second = asyncio.run(h.pool_step())
    assert desired_events(first) == ["Desired slots 0 → 1 (backlog " + _backlog(h) + ")"]
    assert desired_events(second) == []
    assert first.status["desiredSlots"] == second.status["desiredSlots"] == 1


def _backlog(h: ReconcilerHarness) -> str:
    return str({"expedited": 0, "standard": 2, "flex": 0})


def test_a_patch_that_only_reports_waits_while_rounds_follow_each_other(
    tmp_path: pathlib.Path,
) -> None:
    """Queue depth, slots in use and the learned throughput are patched at most once per
    REPORT_SECONDS: a round's next one waits for its patch. A held patch goes with the next."""
    h = harness(tmp_path, minSlots=1, maxSlots=1)
    h.pool_round()
    submit(h, "batch-" + "b" * 24, requests=2)
    sent = asyncio.run(h.pool_step())  # its patch is not in the pool yet
    assert sent.status["queueDepth"] == {"expedited": 0, "standard": 2, "flex": 0}
    held = asyncio.run(h.pool_step())
    assert held.status == {}  # it only reports (desiredSlots stays 1), within the window
    h.now += REPORT_SECONDS
    h.pool_round()  # sent again: the pool still does not show it
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    assert pool["status"]["queueDepth"] == {"expedited": 0, "standard": 2, "flex": 0}


def test_a_change_of_the_scaling_state_is_patched_at_once(tmp_path: pathlib.Path) -> None:
    h = harness(tmp_path, minSlots=0)
    h.pool_round()
    submit(h, "batch-" + "c" * 24, requests=2)
    h.pools._reported["pool-a"] = h.now  # a report just went
    result = asyncio.run(h.pool_step())
    assert result.status["desiredSlots"] == 1


def test_a_value_that_went_back_before_the_pool_showed_it_is_sent_again(
    tmp_path: pathlib.Path,
) -> None:
    """A round's patch may land after the next round read the pool: a field that round N sent
    and round N+1 computes back to what the pool still shows is sent again."""
    h = harness(tmp_path, minSlots=0)
    submit(h, "batch-" + "d" * 24, requests=2)
    first = asyncio.run(h.pool_step())  # desired 0 -> 1, not yet in the pool
    assert first.status["desiredSlots"] == 1
    h.pools._latest["pool-a"] = ({**h.pools._latest["pool-a"][0], "desiredSlots": 5}, h.now)
    second = asyncio.run(h.pool_step())  # computes 1 again: differs from what went last
    assert second.status["desiredSlots"] == 1


def test_the_last_computed_status_counts_only_while_young(tmp_path: pathlib.Path) -> None:
    """Another replica may have led meanwhile: after LATEST_SECONDS the pool's status is the
    truth again (here: no "Desired slots" step from a remembered value)."""
    h = harness(tmp_path, minSlots=0)
    submit(h, "batch-" + "e" * 24, requests=2)
    asyncio.run(h.pool_step())
    h.pools._latest["pool-a"] = ({**h.pools._latest["pool-a"][0], "desiredSlots": 2}, h.now)
    h.pools.kick("pool-a")  # a round that decides (a quiet one computes nothing)
    assert desired_events(asyncio.run(h.pool_step())) == [
        "Desired slots 2 → 1 (backlog " + _backlog(h) + ")"
    ]
    h.pools._latest["pool-a"] = ({"desiredSlots": 2}, h.now - LATEST_SECONDS)
    h.pools.kick("pool-a")
    assert desired_events(asyncio.run(h.pool_step())) == [
        "Desired slots 0 → 1 (backlog " + _backlog(h) + ")"
    ]


# --- the slot Job listing --------------------------------------------------------------------


@pytest.fixture
def listed(tmp_path: pathlib.Path) -> tuple[ReconcilerHarness, list[float]]:
    """A harness whose rounds reuse the slot Job listing for 1 s (the operator's default), and
    the harness clock at each listing."""
    h = ReconcilerHarness(tmp_path, slot_job_listing_seconds=1.0)
    h.kube.add("batchpools", make_pool(scaleDownCooldownSeconds=0, minSlots=1, maxSlots=1))
    times: list[float] = []
    real = h.kube.list_jobs

    async def list_jobs(namespace: str, selector: str) -> list[dict[str, Any]]:
        times.append(h.now)
        return await real(namespace, selector)

    h.kube.list_jobs = list_jobs  # type: ignore[method-assign]
    return h, times


def test_a_round_lists_again_after_the_operator_created_a_slot_job(
    listed: tuple[ReconcilerHarness, list[float]],
) -> None:
    h, times = listed
    h.pool_round()  # lists, then starts the minSlots slot
    assert len(h.jobs()) == 1
    assert len(times) == 1
    h.pool_round()  # its own new Job: listed again, and it is seen (no second slot)
    assert len(times) == 2
    assert len(h.jobs()) == 1
    h.now += 0.5
    h.pool_round()  # within a second: the listing is reused
    assert len(times) == 2
    assert len(h.jobs()) == 1


def test_an_aging_listing_is_renewed_in_the_background_and_an_old_one_at_once(
    listed: tuple[ReconcilerHarness, list[float]],
) -> None:
    """Between 1 and 1.5 s the round goes on with the listing it has while a new one is taken;
    older, the round waits for a new one. A Job someone else deleted is seen that much later."""
    h, times = listed
    h.pool_round()
    h.pool_round()
    (job,) = h.jobs()
    h.kube.remove("jobs", job["metadata"]["namespace"], job["metadata"]["name"])  # not by us
    h.now += 1.2

    async def aging() -> None:
        await h.pool_step()
        await asyncio.sleep(0.01)  # the background listing runs

    asyncio.run(aging())
    assert times[-1] == h.now
    assert len(h.jobs()) == 0
    h.now += 1.6
    h.pool_round()  # the renewed listing is 1.6 s old: listed before the round
    assert times[-1] == h.now
    assert len(h.jobs()) == 1  # the gone slot was seen gone, and minSlots started another


def test_every_round_lists_with_the_listing_reuse_off(tmp_path: pathlib.Path) -> None:
    h = ReconcilerHarness(tmp_path)  # the harness sets slot_job_listing_seconds to 0
    h.kube.add("batchpools", make_pool())
    calls: list[int] = []
    real = h.kube.list_jobs

    async def list_jobs(namespace: str, selector: str) -> list[dict[str, Any]]:
        calls.append(1)
        return await real(namespace, selector)

    h.kube.list_jobs = list_jobs  # type: ignore[method-assign]
    for _ in range(3):
        h.pool_round()
    assert len(calls) == 3


def test_a_round_whose_look_finds_nothing_changed_decides_nothing(tmp_path: pathlib.Path) -> None:
    """#30: with thousands of batches waiting, a round copied the index of every running batch
    and planned the whole queue twice a second although nothing had changed. A quiet round only
    looks (the slots' heartbeats); a shard that ends, new work or the quiet period's end make
    the next one decide."""
    h = harness(tmp_path, minSlots=0, maxSlots=1)
    name = submit(h, "batch-" + "q" * 24, requests=4)
    listings: list[float] = []

    def batches() -> list[dict[str, Any]]:
        listings.append(h.now)
        return [
            entry["pool-a"]
            for b in h.kube.all("batches")
            if (entry := running_entry(b)) and "pool-a" in entry
        ]

    def round_() -> PoolRound:
        return asyncio.run(h.pools.step("pool-a", pool_spec(h), pool_status(h), None, batches))

    assert not round_().quiet  # new work: it decides (and starts a slot)
    h.now += 1
    round_()  # it sees its own grants: this one may decide too (nothing to do)
    h.now += 1
    assert round_().quiet  # nothing changed: it only looked
    assert len(listings) == 2
    (job,) = h.jobs()
    h.run_slot(job, exits=False)  # the slot runs the shard and reports it done
    h.now += 1
    assert not round_().quiet
    h.step(name)
    h.now += QUIET_SECONDS + 1
    assert not round_().quiet  # the quiet period ended: a round decides again
    assert len(listings) == 4


def pool_spec(h: ReconcilerHarness) -> dict[str, Any]:
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    return dict(pool["spec"])


def pool_status(h: ReconcilerHarness) -> dict[str, Any]:
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    return dict(pool.get("status") or {})


def test_a_kick_after_a_long_full_round_waits_a_multiple_of_that_round(
    tmp_path: pathlib.Path,
) -> None:
    """#30: each acceptance kicks its pool, and a full round walks every running batch: at
    10,000 batches rounds back to back took the loop and acceptance slowed with depth. The
    next round waits ``ROUND_PACE`` times the last full round's duration (at most
    ``PACE_LIMIT``); a short round delays nothing."""
    h = harness(tmp_path, minSlots=0, maxSlots=1)
    submit(h, "batch-" + "p" * 24, requests=4)

    def batches() -> list[dict[str, Any]]:
        h.now += 0.1  # a round that walks many batches takes 100 ms
        return [e["pool-a"] for b in h.kube.all("batches") if (e := running_entry(b))]

    asyncio.run(h.pools.step("pool-a", pool_spec(h), pool_status(h), None, batches))
    h.pools.kick("pool-a")
    assert not h.pools.due("pool-a")
    h.now += ROUND_PACE * 0.1 - 0.01
    assert not h.pools.due("pool-a")
    h.now += 0.02
    assert h.pools.due("pool-a")
    h.now += 10  # a round that takes no time: a kick makes the next one due at once
    asyncio.run(h.pools.step("pool-a", pool_spec(h), pool_status(h), None, list))
    h.pools.kick("pool-a")
    assert h.pools.due("pool-a")


def test_a_round_that_waits_on_the_store_paces_the_next_by_its_loop_time(
    tmp_path: pathlib.Path,
) -> None:
    """#30's burst: a round granting a hundred shards waits ~0.4 s on store writes in its
    threads while the event loop serves acceptances; paced by that wall time, rounds came a
    second apart and each accepted batch waited for the next. The pace is ROUND_PACE times
    the loop's CPU time in the round (here 10 ms of 400), so a kick after it is due within
    30 ms, not 1 s."""
    h = harness(tmp_path, minSlots=0, maxSlots=1)
    submit(h, "batch-" + "w" * 24, requests=4)
    cpu = [0.0]
    h.pools.cpu_clock = lambda: cpu[0]

    def batches() -> list[dict[str, Any]]:
        h.now += 0.4  # the round's wall time: mostly store writes in its threads
        cpu[0] += 0.01  # the loop's share of it
        return [e["pool-a"] for b in h.kube.all("batches") if (e := running_entry(b))]

    asyncio.run(h.pools.step("pool-a", pool_spec(h), pool_status(h), None, batches))
    h.pools.kick("pool-a")
    assert not h.pools.due("pool-a")
    h.now += ROUND_PACE * 0.01 + 0.001
    assert h.pools.due("pool-a")
