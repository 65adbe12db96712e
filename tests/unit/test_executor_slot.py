"""The warm slot loop on the simulated engine and the filesystem store: one engine start for
shards assigned over time, bounded concurrency, revocation, lease fencing, drain, idle exit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import Assignment, SlotHeartbeat, SlotSpec
from llmbatch.core import keys
from llmbatch.executor.engines.simulated import SimulatedEngine
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.executor.slot import ChannelAssignments, Slot, SlotSettings
from llmbatch.storage import open_store
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.shardresults import list_chunks, read_progress
from llmbatch.storage.slotchannel import SlotChannel, grant_lease, read_lease

CHANNEL = keys.slot_prefix("pool-a", "slot-0")


class Rig:
    """A store, the slot's channel, and shards whose input is in the store."""

    def __init__(self, root: Path) -> None:
        self.uri = f"file://{root}"
        self.store: ObjectStore = open_store(self.uri)
        self.channel = SlotChannel(self.store, CHANNEL)

    def shard(self, uid: str, requests: int, **changes: Any) -> ShardSpec:
        key = f"work/ns/{uid}/input.jsonl"
        rows = [
            {
                "custom_id": f"{uid}-r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]},
            }
            for i in range(requests)
        ]
        self.store.put(key, b"".join(orjson.dumps(r) + b"\n" for r in rows))
        base: dict[str, Any] = {
            "batch_id": f"batch_{uid}",
            "batch_uid": uid,
            "endpoint": "/v1/chat/completions",
            "store": self.uri,
            "input_key": key,
            "output_prefix": keys.shard_prefix("ns", uid, 0),
            "model": {"name": "m", "path": "/nowhere"},
            "engine": {"name": "simulated", "args": {}},
            "flush_lines": 2,
            "flush_seconds": 0.1,
        }
        return ShardSpec.model_validate(base | changes)

    def assign(self, spec: ShardSpec, slot: str = "slot-0", when: float = 0.0) -> Assignment:
        lease_key = keys.shard_lease_key(spec.output_prefix)
        lease = grant_lease(self.store, lease_key, slot, time.time())
        assignment = Assignment(
            shard=spec, lease_key=lease_key, generation=lease.generation, assigned_at=when
        )
        self.channel.assign(assignment)
        return assignment

    def slot(self, engine: SimulatedEngine, **settings: Any) -> Slot:
        pace: dict[str, Any] = {"poll_seconds": 0.05, "heartbeat_seconds": 0.05}
        return Slot(
            engine,
            ChannelAssignments(self.channel),
            lambda spec: (self.store, self.store),
            SlotSettings(name="slot-0", **(pace | settings)),
        )

    def done_ids(self, spec: ShardSpec) -> list[str]:
        ids = []
        for kind in ("output", "errors"):
            for key in list_chunks(self.store, spec.output_prefix, kind):
                for raw in self.store.get(key).splitlines():
                    ids.append(orjson.loads(raw)["custom_id"])
        return ids


def _engine(**args: Any) -> SimulatedEngine:
    return SimulatedEngine(args, ["m"])


async def _started(engine: SimulatedEngine) -> SimulatedEngine:
    await engine.start()
    return engine


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro())


def test_one_engine_runs_shards_assigned_over_time_then_exits_when_idle(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    first, second = rig.shard("a", 5), rig.shard("b", 3)

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.01))
        slot = rig.slot(engine, idle_seconds=0.6, concurrency=2)
        rig.assign(first)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: (p := read_progress(rig.store, first.output_prefix)) is not None
                     and p.done)  # fmt: skip
        await asyncio.sleep(0.2)  # idle, but not long enough to exit
        assert not task.done()
        rig.assign(second, when=1.0)
        assert await asyncio.wait_for(task, 10) is Outcome.DONE

    _run(go)
    assert sorted(rig.done_ids(rig.shard("a", 5))) == sorted(f"a-r{i}" for i in range(5))
    assert sorted(rig.done_ids(rig.shard("b", 3))) == sorted(f"b-r{i}" for i in range(3))
    beat = rig.channel.heartbeat()
    assert beat is not None
    assert beat.state == "exited"
    assert beat.engine_starts == 1
    assert {r.key: r.state for r in beat.shards} == {"a-00000": "done", "b-00000": "done"}
    assert beat.busy_seconds > 0
    assert sum(r.busy_seconds for r in beat.shards) == pytest.approx(beat.busy_seconds, abs=0.01)


def test_no_more_shards_at_once_than_the_concurrency(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    specs = [rig.shard(uid, 4) for uid in "abc"]
    most = 0

    async def go() -> None:
        nonlocal most
        engine = await _started(_engine(latency_seconds=0.05))
        slot = rig.slot(engine, concurrency=2)
        for i, spec in enumerate(specs):
            rig.assign(spec, when=float(i))
        task = asyncio.ensure_future(slot.run())
        while not task.done():
            running = sum(1 for r in slot.runners if r.stats.in_flight)
            most = max(most, running)
            await asyncio.sleep(0.005)
        assert task.result() is Outcome.DONE
        # the oldest assignments start first
        assert [r.spec.batch_uid for r in slot.runners] == ["a", "b", "c"]

    _run(go)
    assert most == 2
    for spec in specs:
        assert len(rig.done_ids(spec)) == 4


@pytest.mark.parametrize(
    ("configured", "max_num_seqs", "expected"), [(None, 32, 4), (None, 256, 8), (3, 32, 3)]
)
def test_a_slot_sizes_its_concurrency_from_its_engine_unless_the_pool_says(
    tmp_path: Path, configured: int | None, max_num_seqs: int, expected: int
) -> None:
    """A pool without slotConcurrency leaves it to the slot: one shard per 8 sequences of the
    loaded engine (the CPU vLLM engine runs 32, vLLM's GPU default 256), reported in the
    heartbeat, where the pool scheduler reads the slot's room from."""
    rig = Rig(tmp_path)
    spec = SlotSpec(
        pool="pool-a",
        slot="slot-0",
        store=rig.uri,
        channel_prefix=CHANNEL,
        model={"name": "m", "path": "/nowhere"},  # type: ignore[arg-type]
        engine={"name": "simulated", "args": {}},  # type: ignore[arg-type]
        concurrency=configured,
        poll_seconds=0.05,
    )

    async def go() -> None:
        engine = await _started(_engine(max_num_seqs=max_num_seqs))
        settings = SlotSettings.of(spec, engine)
        assert settings.concurrency == expected
        slot = Slot(
            engine, ChannelAssignments(rig.channel), lambda _: (rig.store, rig.store), settings
        )
        assert await slot.run() is Outcome.DONE  # nothing assigned, idleSeconds 0: it exits

    _run(go)
    beat = rig.channel.heartbeat()
    assert beat is not None
    assert beat.concurrency == expected


def test_an_expedited_shard_starts_at_once_on_a_full_slot_in_its_express_seat(
    tmp_path: Path,
) -> None:
    """Concurrency 1, a long standard shard running: an expedited shard assigned next starts at
    once beside it (the express seat), while another standard shard waits for the seat."""
    rig = Rig(tmp_path)
    long = rig.shard("a", 40, max_in_flight=1)
    waiting = rig.shard("b", 2)
    urgent = rig.shard("c", 2, tier="expedited")
    started: dict[str, float] = {}

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.05))
        slot = rig.slot(engine, concurrency=1)
        slot.on_runner = lambda r: started.setdefault(r.spec.batch_uid, time.monotonic())
        rig.assign(long, when=0.0)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: "a" in started)
        rig.assign(waiting, when=1.0)
        rig.assign(urgent, when=2.0)
        await _until(lambda: "c" in started)
        assert "b" not in started  # the standard one still waits for the seat
        assert not task.done()  # the long shard still runs beside the expedited one
        assert await task is Outcome.DONE

    _run(go)
    assert started["a"] < started["c"] < started["b"]
    for spec, requests in ((long, 40), (waiting, 2), (urgent, 2)):
        assert len(set(rig.done_ids(spec))) == len(rig.done_ids(spec)) == requests


def test_a_revoked_shard_stops_keeps_its_results_and_resumes_when_assigned_again(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    spec = rig.shard("a", 40, max_in_flight=1)

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.02))
        slot = rig.slot(engine, idle_seconds=5)
        assignment = rig.assign(spec)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: len(rig.done_ids(spec)) >= 4)
        rig.channel.revoke(assignment.key)  # preemption: stop feeding, commit, give it back
        await _until(lambda: slot.reports.get(assignment.key) is None and not slot._running)
        kept = rig.done_ids(spec)
        assert 4 <= len(kept) < 40
        rig.assign(spec)  # back from the queue, under the next generation
        await _until(lambda: len(rig.done_ids(spec)) >= 40)
        slot.request_stop()
        assert await asyncio.wait_for(task, 10) in (Outcome.DONE, Outcome.PREEMPTED)

    _run(go)
    ids = rig.done_ids(spec)
    assert sorted(ids) == sorted(f"a-r{i}" for i in range(40))  # each once
    lease = read_lease(rig.store, keys.shard_lease_key(spec.output_prefix))
    assert lease is not None
    assert lease.generation == 2


def test_a_runner_whose_lease_went_elsewhere_commits_nothing_more(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    spec = rig.shard("a", 30, max_in_flight=1)
    runners: list[ShardRunner] = []

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.02))
        slot = rig.slot(engine)
        slot.on_runner = runners.append
        rig.assign(spec)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: len(rig.done_ids(spec)) >= 4)
        # The operator believed this slot dead and gave the shard to another one.
        grant_lease(rig.store, keys.shard_lease_key(spec.output_prefix), "slot-1", time.time())
        frozen = len(rig.done_ids(spec))
        assert await asyncio.wait_for(task, 10) is Outcome.DONE
        assert len(rig.done_ids(spec)) - frozen <= 2  # at most the commit already under way

    _run(go)
    assert runners[0].message is not None
    assert "lease lost" in runners[0].message
    beat = rig.channel.heartbeat()
    assert beat is not None
    assert [r.state for r in beat.shards] == ["lease_lost"]
    progress = read_progress(rig.store, spec.output_prefix)
    assert progress is not None
    assert not progress.done


def test_drain_finishes_running_shards_and_takes_no_new_ones(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    running, waiting = rig.shard("a", 10), rig.shard("b", 10)

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.02))
        slot = rig.slot(engine, idle_seconds=30)
        rig.assign(running)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: bool(slot.runners))
        rig.assign(waiting, when=1.0)
        rig.channel.request_drain()
        assert await asyncio.wait_for(task, 10) is Outcome.DONE

    _run(go)
    assert len(rig.done_ids(running)) == 10
    assert rig.done_ids(waiting) == []
    beat = rig.channel.heartbeat()
    assert isinstance(beat, SlotHeartbeat)
    assert beat.state == "exited"


def test_stop_preempts_every_running_shard(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    specs = [rig.shard(uid, 50, max_in_flight=1) for uid in "ab"]

    async def go() -> None:
        engine = await _started(_engine(latency_seconds=0.02))
        slot = rig.slot(engine, concurrency=2, idle_seconds=30)
        for spec in specs:
            rig.assign(spec)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: all(rig.done_ids(s) for s in specs))
        slot.request_stop()
        assert await asyncio.wait_for(task, 10) is Outcome.PREEMPTED

    _run(go)
    for spec in specs:
        progress = read_progress(rig.store, spec.output_prefix)
        assert progress is not None
        assert not progress.done
        assert 0 < len(rig.done_ids(spec)) < 50


@pytest.mark.parametrize("idle", [0.0, 0.3])
def test_an_idle_slot_exits_after_idle_seconds(tmp_path: Path, idle: float) -> None:
    rig = Rig(tmp_path)

    async def go() -> None:
        engine = await _started(_engine())
        slot = rig.slot(engine, idle_seconds=idle)
        t0 = time.monotonic()
        assert await asyncio.wait_for(slot.run(), 5) is Outcome.DONE
        assert idle <= time.monotonic() - t0 < idle + 1.0

    _run(go)


def test_a_slot_kept_warm_outlives_its_idle_time_until_the_mark_is_gone(tmp_path: Path) -> None:
    """minSlots: the operator's keep mark holds an idle slot up; without it, it idles out."""
    rig = Rig(tmp_path)

    async def go() -> None:
        engine = await _started(_engine())
        slot = rig.slot(engine, idle_seconds=0.1)
        rig.channel.keep_warm(True)
        task = asyncio.ensure_future(slot.run())
        await asyncio.sleep(0.6)  # six times its idle time
        assert not task.done()
        rig.assign(rig.shard("a", 2))  # and it still runs what comes
        await _until(lambda: len(rig.done_ids(rig.shard("a", 2))) == 2)
        rig.channel.keep_warm(False)
        assert await asyncio.wait_for(task, 5) is Outcome.DONE

    _run(go)


def test_a_shard_end_is_reported_at_once_not_at_the_next_heartbeat(tmp_path: Path) -> None:
    """The heartbeat renews leases every heartbeat_seconds, but a shard that ended is reported
    at once: the scheduler frees its seat (and settles it) without waiting for the renewal."""
    rig = Rig(tmp_path)
    spec = rig.shard("a", 2)

    async def go() -> None:
        engine = await _started(_engine())
        slot = rig.slot(engine, idle_seconds=30, heartbeat_seconds=60)
        rig.assign(spec)
        task = asyncio.ensure_future(slot.run())

        def reported_done() -> bool:
            beat = rig.channel.heartbeat()
            return beat is not None and [r.state for r in beat.shards] == ["done"]

        await _until(reported_done, timeout=3)  # a minute before the next renewal is due
        assert not task.done()
        slot.request_stop()
        await task

    _run(go)


def test_a_kept_slot_never_exits_between_its_keep_check_and_its_exit_check(tmp_path: Path) -> None:
    """The keep mark is read when the idle time has run out, and the exit is decided on that
    same reading: time passing between the two (a slow heartbeat write) must not let a kept
    slot exit. A clock that moves on at every read forces that interleaving every loop."""
    rig = Rig(tmp_path)
    ticks = iter(range(10**9))

    async def go() -> None:
        engine = await _started(_engine())
        slot = rig.slot(engine, idle_seconds=2.5)
        slot.clock = lambda: float(next(ticks))  # one second per read
        slot.__post_init__()  # re-anchor its idle timer on this clock
        rig.channel.keep_warm(True)
        task = asyncio.ensure_future(slot.run())
        await asyncio.sleep(0.5)  # ten polls, each well past the idle time on this clock
        assert not task.done(), "a kept slot exited"
        rig.channel.keep_warm(False)
        assert await asyncio.wait_for(task, 5) is Outcome.DONE

    _run(go)


def test_the_slot_process_runs_its_assignments_and_exits_idle(tmp_path: Path) -> None:
    """``python -m llmbatch.executor --slot SPEC`` (in-process): engine once, shard, exit 0."""
    from llmbatch.api.slot import SlotSpec
    from llmbatch.executor.main import main

    rig = Rig(tmp_path)
    spec = rig.shard("a", 6)
    rig.assign(spec)
    slot_spec = SlotSpec(
        pool="pool-a",
        slot="slot-0",
        store=rig.uri,
        channel_prefix=CHANNEL,
        model=spec.model,
        engine=spec.engine,
        poll_seconds=0.05,
    )
    path = tmp_path / "slot.json"
    path.write_text(slot_spec.model_dump_json())
    log = tmp_path / "termination-log"
    assert main(["--slot", str(path), "--termination-log", str(log)]) == 0
    assert sorted(rig.done_ids(spec)) == sorted(f"a-r{i}" for i in range(6))
    beat = rig.channel.heartbeat()
    assert beat is not None
    assert beat.state == "exited"
    assert beat.shards[0].state == "done"
    assert not log.exists()


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_an_expedited_shard_overtakes_the_queued_requests_of_a_busy_slot(
    tmp_path: Path, policy: str
) -> None:
    """A standard shard keeps 20 requests in an engine that runs 2 at once; an expedited shard
    assigned then is answered before the 18 standard requests queued ahead of it (with the
    priority policy the executor gives vLLM), and nothing is killed or lost."""
    rig = Rig(tmp_path)
    standard = rig.shard("s", 60, max_in_flight=20)
    expedited = rig.shard("e", 4, tier="expedited")
    overtaken: list[int] = []

    async def go() -> None:
        engine = await _started(
            _engine(latency_seconds=0.1, max_running=2, scheduling_policy=policy)
        )
        slot = rig.slot(engine, concurrency=2)
        rig.assign(standard)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: any(r.stats.in_flight == 20 for r in slot.runners))
        running = slot.runners[0]
        before = running.stats.completed
        rig.assign(expedited, when=1.0)
        await _until(lambda: len(slot.runners) == 2 and slot.runners[1].stats.completed == 4)
        overtaken.append(running.stats.completed - before)
        assert await asyncio.wait_for(task, 20) is Outcome.DONE

    _run(go)
    # standard requests answered while the expedited shard was assigned, admitted and answered:
    # the two running ones (and a poll's worth) with priorities, the whole queue ahead without
    if policy == "priority":
        assert overtaken[0] <= 6
    else:
        assert overtaken[0] >= 16
    assert sorted(rig.done_ids(standard)) == sorted(f"s-r{i}" for i in range(60))
    assert sorted(rig.done_ids(expedited)) == sorted(f"e-r{i}" for i in range(4))


def test_a_slot_counts_its_life_from_its_process_start() -> None:
    """The slot's ``started_at`` is when its process started, before the interpreter and the
    executor's imports (part of the engine start a busy fraction is measured against)."""
    code = (
        "import time; time.sleep(0.6); "
        "from llmbatch.executor.slotprocess import process_started_at; "
        "print(time.time() - process_started_at())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    age = float(out.stdout)
    assert 0.6 <= age < 10


@dataclass
class FlakyReports(ChannelAssignments):
    """The channel, with heartbeats that cannot be written while ``failing``."""

    failing: bool = True
    written: list[SlotHeartbeat] = field(default_factory=list)

    async def report(self, heartbeat: SlotHeartbeat) -> None:
        if self.failing:
            raise StoreError("store down")
        self.written.append(heartbeat)
        await super().report(heartbeat)


def test_no_request_of_a_shard_reaches_the_engine_before_a_heartbeat_reported_it(
    tmp_path: Path,
) -> None:
    """The operator charges an attempt for a lost slot's shard only when the slot reported it
    started; so no request of a run reaches the engine before a heartbeat saying so is
    written. With the store refusing heartbeats the assigned shard's requests wait; they run
    once one is written; stopped before that, the run ends with nothing sent."""
    rig = Rig(tmp_path)
    first, second = rig.shard("a", 2), rig.shard("b", 2)

    async def go() -> None:
        engine = await _started(_engine())
        source = FlakyReports(rig.channel)
        slot = Slot(
            engine,
            source,
            lambda spec: (rig.store, rig.store),
            SlotSettings(name="slot-0", poll_seconds=0.05, heartbeat_seconds=0.05, idle_seconds=30),
        )
        rig.assign(first)
        task = asyncio.ensure_future(slot.run())
        await asyncio.sleep(0.5)
        assert rig.done_ids(first) == []  # not started: no heartbeat has said so
        assert [r.stats.completed for r in slot.runners] == [0]
        source.failing = False
        await _until(lambda: sorted(rig.done_ids(first)) == ["a-r0", "a-r1"])
        started = next(b for b in source.written if b.shards)
        assert [(r.key, r.state) for r in started.shards] == [("a-00000", "running")]
        source.failing = True
        rig.assign(second)
        await asyncio.sleep(0.3)
        slot.request_stop()  # before any heartbeat reported the second shard started
        await task
        assert rig.done_ids(second) == []
        assert slot.runners[-1].stats.completed == 0

    _run(go)
