"""A full pool and the batches that join its queue (#30): with 10,000 batches queued a full
round orders them all, and every acceptance asked for one. A batch whose shards the pool's last
full round proved would only wait (``core.slots.Saturation``) joins without a round until the
slots change, and a full round counts it within JOIN_SECONDS; what could be placed — expedited
work, a pool that may still grow, a tenant a preemption may serve — kicks a round as before."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest

from llmbatch.controller.pools import JOIN_SECONDS, PoolRound
from llmbatch.controller.runningindex import running_entry
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_slot_scheduler import beat, channel


def accept(h: ReconcilerHarness, name: str, **spec: Any) -> str:
    """Submit a one-shard batch and step it until its shard waits for a slot, the clock still
    (each step hands the accepted batch to its pool, as the watch does)."""
    file_id = f"file-{name[-32:]:0>32}"
    h.kube.add("batchfiles", make_input_file(h.store, file_id, 2))
    h.kube.add("batches", make_batch(name, input_file_id=file_id, **spec))
    for _ in range(10):
        if h.status(name).get("status") == "in_progress":
            break
        h.step(name, advance=0)
    h.step(name, advance=0)  # the shard specs: queued
    return name


class Rounds:
    """The pool timer's rounds of ``pool-a``, counting the ones that decided (listed the
    running batches)."""

    def __init__(self, h: ReconcilerHarness) -> None:
        self.h = h
        self.full = 0

    def batches(self) -> list[dict[str, Any]]:
        self.full += 1
        entries = (running_entry(b) for b in self.h.kube.all("batches"))
        return [entry["pool-a"] for entry in entries if "pool-a" in entry]

    def run(self) -> PoolRound:
        pool = self.h.kube.get("batchpools", None, "pool-a")
        assert pool is not None
        status = pool.setdefault("status", {})
        result = asyncio.run(
            self.h.pools.step("pool-a", dict(pool["spec"]), dict(status), None, self.batches)
        )
        status.update(result.status)
        return result


def full_pool(tmp_path: pathlib.Path, **spec: Any) -> tuple[ReconcilerHarness, Rounds]:
    """A pool of one loaded slot with one seat and no queue, that seat taken and a standard
    batch waiting; its last round decided (and placed nothing)."""
    h = ReconcilerHarness(tmp_path)
    pool = {"minSlots": 0, "maxSlots": 1, "slotConcurrency": 1, "slotQueue": 0, **spec}
    h.kube.add("batchpools", make_pool(scaleDownCooldownSeconds=0, **pool))
    rounds = Rounds(h)
    accept(h, "batch-" + "a" * 24)
    rounds.run()
    (job,) = h.jobs()
    beat(h, job["metadata"]["name"])
    accept(h, "batch-" + "b" * 24)
    h.now += 1
    assert not rounds.run().quiet
    h.now += 1
    rounds.run()  # the round after its own look: nothing it did shows, nothing to decide
    return h, rounds


def standard_depth(h: ReconcilerHarness) -> int:
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    return int(pool["status"]["queueDepth"]["standard"])


def test_a_batch_that_would_only_wait_joins_a_full_pool_without_a_round(
    tmp_path: pathlib.Path,
) -> None:
    h, rounds = full_pool(tmp_path)
    decided, depth = rounds.full, standard_depth(h)
    accept(h, "batch-" + "c" * 24)
    assert not h.pools.due("pool-a")  # no kick: the pool waits for its backlog's recheck
    for _ in range(2):
        h.now += 0.3
        assert rounds.run().quiet  # which only looks: no round decides for it...
    assert rounds.full == decided
    assert standard_depth(h) == depth
    h.now += JOIN_SECONDS
    assert not rounds.run().quiet  # ...until JOIN_SECONDS after the last full round
    assert rounds.full == decided + 1
    assert standard_depth(h) == depth + 2
    h.now += JOIN_SECONDS + 1
    assert rounds.run().quiet  # counted: quiet again (for QUIET_SECONDS)


def test_expedited_work_kicks_a_full_pool_at_once(tmp_path: pathlib.Path) -> None:
    """Its shard takes the full slot's express seat in the round it kicks."""
    h, rounds = full_pool(tmp_path)
    name = accept(h, "batch-" + "x" * 24, priority="expedited")
    assert h.pools.due("pool-a")
    assert not rounds.run().quiet
    uid = h.batch(name)["metadata"]["uid"]
    (job,) = h.jobs()
    assert any(key.startswith(uid) for key in channel(h, job["metadata"]["name"]).assignments())


@pytest.mark.parametrize(
    "spec",
    [
        # below its maximum slots, a deeper queue may start a slot
        {"maxSlots": 2, "throughputPerSlot": "0.01"},
        # a tenant that joins changes every tenant's share: who may lose a seat to a guarantee
        {"fairSharing": {"preemption": "BelowGuarantee"}},
    ],
    ids=["may-still-grow", "preempts-for-guarantees"],
)
def test_a_pool_whose_decisions_a_deeper_queue_changes_decides_for_every_new_batch(
    tmp_path: pathlib.Path, spec: dict[str, Any]
) -> None:
    h, rounds = full_pool(tmp_path, **spec)
    accept(h, "batch-" + "c" * 24)
    assert h.pools.due("pool-a")
    assert not rounds.run().quiet


def test_a_seat_that_frees_goes_to_the_queue_head_at_the_next_round(
    tmp_path: pathlib.Path,
) -> None:
    """What joined without a round is placed as soon as the slots change (the slot that
    ended its run is replaced, and takes work again once ready)."""
    h, rounds = full_pool(tmp_path)
    accept(h, "batch-" + "c" * 24)
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    assert h.run_slot(job, exits=False).value == "done"  # the running shard ends
    h.now += 0.6
    assert not rounds.run().quiet  # settles the done report, takes the assignment back
    beat(h, slot, seq=2)  # idle and ready
    h.now += 0.6
    assert not rounds.run().quiet
    granted = {key for j in h.jobs() for key in channel(h, j["metadata"]["name"]).assignments()}
    for name in ("batch-" + "b" * 24, "batch-" + "c" * 24):
        uid = h.batch(name)["metadata"]["uid"]
        assert any(key.startswith(uid) for key in granted)
