"""A slot: one started engine running the shards it is assigned, several at once.

The same loop serves every way the executor runs. A warm pool slot reads its assignments from
the slot channel in the store (:class:`ChannelAssignments`), renews its leases with a heartbeat
and exits after ``idle_seconds`` with nothing to run or when asked to drain. ``--shard-spec``
and ``llmbatch run`` are the degenerate case: a fixed list of shards without leases
(:class:`FixedAssignments`); the slot exits once they have all ended.

A shard's assignment taken back (revoked, or re-granted under a newer lease generation) means
"stop feeding it, commit what finished"; a runner whose lease was given to another slot stops
without committing more (:class:`~llmbatch.storage.slotchannel.LeaseFence`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from llmbatch import logs
from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import Assignment, ShardReport, ShardState, SlotHeartbeat, SlotSpec
from llmbatch.core.slots import seats, slot_concurrency, start_order
from llmbatch.executor.engines.base import Engine
from llmbatch.executor.mediafetch import Fetchers
from llmbatch.executor.mediagate import MediaGate
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.executor.sharedengine import BusyLedger, EngineGate, MediaInFlight, SharedEngine
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.slotchannel import LeaseFence, SlotChannel

log = logging.getLogger("llmbatch.executor")

#: Worst first: the slot's exit reflects the worst shard outcome it saw.
_SEVERITY = (Outcome.ENGINE_FAILED, Outcome.STORE_FAILED, Outcome.PREEMPTED)
OpenStores = Callable[[ShardSpec], tuple[ObjectStore, ObjectStore]]


class AssignmentSource(Protocol):
    """Where a slot's work comes from and where it reports."""

    fixed: bool
    """True when the list of shards never changes (the slot ends once they have all ended)."""

    async def current(self) -> dict[str, Assignment]:
        """The shards assigned now, by assignment key."""
        ...

    async def drain_requested(self) -> bool: ...

    async def keep_warm(self) -> bool:
        """Whether to stay up past the idle time (the operator keeps ``minSlots`` warm)."""
        ...

    async def report(self, heartbeat: SlotHeartbeat) -> None: ...


@dataclass
class FixedAssignments:
    """A fixed list of shards without leases: ``--shard-spec`` and ``llmbatch run``."""

    specs: Sequence[ShardSpec]
    fixed: bool = True

    async def current(self) -> dict[str, Assignment]:
        assignments = (Assignment(shard=spec) for spec in self.specs)
        return {a.key: a for a in assignments}

    async def drain_requested(self) -> bool:
        return False

    async def keep_warm(self) -> bool:
        return False

    async def report(self, heartbeat: SlotHeartbeat) -> None:
        return None


@dataclass
class ChannelAssignments:
    """A pool slot's channel in the object store (written by the operator)."""

    channel: SlotChannel
    fixed: bool = False

    async def current(self) -> dict[str, Assignment]:
        return await asyncio.to_thread(self.channel.assignments)

    async def drain_requested(self) -> bool:
        return await asyncio.to_thread(self.channel.drain_requested)

    async def keep_warm(self) -> bool:
        return await asyncio.to_thread(self.channel.keep_requested)

    async def report(self, heartbeat: SlotHeartbeat) -> None:
        heartbeat.unreadable = list(self.channel.unreadable)
        await asyncio.to_thread(self.channel.write_heartbeat, heartbeat)


@dataclass
class _Run:
    assignment: Assignment
    runner: ShardRunner
    task: asyncio.Task[Outcome]
    ledger_key: str
    on_record: asyncio.Event
    """Set once a heartbeat has reported the run started: its requests reach the engine only
    then (:class:`~llmbatch.executor.sharedengine.SharedEngine`)."""
    revoked: bool = False


_STATE: dict[Outcome, ShardState] = {
    Outcome.DONE: "done",
    Outcome.PREEMPTED: "preempted",
    Outcome.ENGINE_FAILED: "engine_failed",
    Outcome.STORE_FAILED: "store_failed",
    Outcome.LEASE_LOST: "lease_lost",
}


async def _run_in_context(runner: ShardRunner, generation: int) -> Outcome:
    """Run a shard with its batch and shard index on every log record of the run."""
    spec = runner.spec
    logs.bind_context(batch_id=spec.batch_id, shard=spec.shard_index)
    log.info(
        "shard %s of %s started (lease generation %d)", spec.shard_index, spec.batch_id, generation
    )
    outcome = await runner.run()
    s = runner.stats
    log.info(
        "shard %s %s: completed=%d failed=%d skipped=%d output_tokens=%d",
        spec.shard_index,
        outcome.value,
        s.completed,
        s.failed,
        s.skipped,
        s.output_tokens,
    )
    return outcome


@dataclass
class SlotSettings:
    """How the slot loop paces itself (from the SlotSpec, or fixed for one-shot runs)."""

    name: str = "local"
    concurrency: int = 1
    idle_seconds: float = 0.0
    heartbeat_seconds: float = 5.0
    poll_seconds: float = 0.5

    @classmethod
    def of(cls, spec: SlotSpec, engine: Engine, **overrides: Any) -> SlotSettings:
        """A pool slot's settings: its spec's, with the concurrency the pool left unset sized
        from the loaded engine's own ``max_num_seqs`` (the operator learns it from the
        heartbeat)."""
        settings = cls(
            name=spec.slot,
            concurrency=spec.concurrency or slot_concurrency(None, engine.max_num_seqs),
            idle_seconds=spec.idle_seconds,
            heartbeat_seconds=spec.heartbeat_seconds,
            poll_seconds=spec.poll_seconds,
        )
        return replace(settings, **overrides)


@dataclass
class Slot:
    """Runs assigned shards on one started engine until idle, drained, stopped or broken."""

    engine: Engine
    source: AssignmentSource
    open_stores: OpenStores
    settings: SlotSettings = field(default_factory=SlotSettings)
    on_runner: Callable[[ShardRunner], object] | None = None
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    process_started_at: float | None = None
    """Unix seconds the process started (before the engine loaded); default: now."""
    runners: list[ShardRunner] = field(default_factory=list, init=False)
    reports: dict[str, ShardReport] = field(default_factory=dict, init=False)
    _running: dict[str, _Run] = field(default_factory=dict, init=False)
    _stopping: bool = field(default=False, init=False)
    _draining: bool = field(default=False, init=False)
    _kept: bool = field(default=False, init=False)
    _idle_out: bool = field(default=False, init=False)
    _seq: int = field(default=0, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    def __post_init__(self) -> None:
        self.ledger = BusyLedger(self.clock)
        self.gate = EngineGate()
        self.media = MediaInFlight(self._heartbeat_now)
        self.fetchers = Fetchers()
        self.ready_at_wall = self.wall()  # the slot is built once its engine is loaded
        self.started_at = self.process_started_at or self.ready_at_wall
        self.ready_at = self.clock()
        self._idle_since = self.clock()
        self._last_heartbeat = -float("inf")
        self.outcomes: list[Outcome] = []

    def request_stop(self) -> None:
        """SIGTERM: stop feeding every shard, commit, exit (the shards go back to the queue)."""
        self._stopping = True
        for run in self._running.values():
            run.runner.request_stop()
        self._wake.set()

    async def run(self) -> Outcome:
        """The loop; returns the worst outcome of the shards it ran (DONE when none failed)."""
        while True:
            assigned = await self._poll()
            self._take_back(assigned)
            self._start(assigned)
            if await self._heartbeat():
                for run in self._running.values():
                    run.on_record.set()
            if self._finished(assigned):
                break
            self._wake.clear()
            tasks = [run.task for run in self._running.values()]
            waiters = [asyncio.ensure_future(self._wake.wait()), *tasks]
            await asyncio.wait(
                waiters, timeout=self.settings.poll_seconds, return_when=asyncio.FIRST_COMPLETED
            )
            waiters[0].cancel()
            self._reap()
        await self._heartbeat(final=True)
        await self.fetchers.close()
        return self._exit_outcome()

    def _heartbeat_now(self) -> None:
        """A request with media waits for a heartbeat naming it: write one at once."""
        self._last_heartbeat = -float("inf")
        self._wake.set()

    def _exit_outcome(self) -> Outcome:
        """How the process ends. A fixed list of shards: its worst shard outcome (the Job
        retries a store failure, preemption does not count). A pool slot: only what happened
        to the slot itself — its engine broke, or it was stopped (SIGTERM); a shard taken back
        or failed is reported in the heartbeat and settled by the operator, and an idle or
        drained slot exits 0 so its Job completes instead of starting a new pod."""
        if self.source.fixed:
            return next((o for o in _SEVERITY if o in self.outcomes), Outcome.DONE)
        if self._engine_failed():
            return Outcome.ENGINE_FAILED
        return Outcome.PREEMPTED if self._stopping else Outcome.DONE

    async def _poll(self) -> dict[str, Assignment]:
        try:
            assigned = await self.source.current()
            if not self._draining and await self.source.drain_requested():
                log.info("slot %s: drain requested", self.settings.name)
                self._draining = True
            # The idle time is read once a loop, here: the exit check (_finished) decides on
            # this reading and the keep mark read with it, never on a later clock.
            self._idle_out = not self._running and self._idle_for() >= self.settings.idle_seconds
            if self._idle_out:
                self._kept = not self.source.fixed and await self.source.keep_warm()
        except StoreError as exc:  # the channel is unreachable: keep running what we have
            log.warning("slot %s: assignments unreadable: %s", self.settings.name, exc)
            return {key: run.assignment for key, run in self._running.items()}
        for key in [k for k in self.reports if k not in assigned and k not in self._running]:
            del self.reports[key]  # the operator took note and removed the assignment
        return assigned

    def _take_back(self, assigned: dict[str, Assignment]) -> None:
        """Stop feeding shards that were revoked or re-granted under a newer generation."""
        for key, run in self._running.items():
            now = assigned.get(key)
            if not run.revoked and (now is None or now.generation != run.assignment.generation):
                log.info("slot %s: shard %s taken back", self.settings.name, key)
                run.revoked = True
                run.runner.request_stop(taken_back=True)

    def _start(self, assigned: dict[str, Assignment]) -> None:
        if self._stopping or self._draining or self._engine_failed():
            return
        # Higher tiers first, then the oldest assignment; an expedited shard may take the
        # express seat beyond the concurrency (core.slots.seats), as the scheduler placed it.
        order = sorted(assigned.items(), key=lambda kv: start_order(kv[1]))
        for key, assignment in order:
            if len(self._running) >= seats(self.settings.concurrency, assignment.shard.tier):
                continue
            if key in self._running or self._ended(key, assignment):
                continue
            self._launch(key, assignment)

    def _ended(self, key: str, assignment: Assignment) -> bool:
        report = self.reports.get(key)
        return report is not None and report.generation == assignment.generation

    def _launch(self, key: str, assignment: Assignment) -> None:
        spec = assignment.shard
        try:
            store, input_store = self.open_stores(spec)
        except (ValueError, StoreError) as exc:  # this shard's store only: the slot goes on
            log.error("slot %s: shard %s has no usable store: %s", self.settings.name, key, exc)
            self.reports[key] = ShardReport(
                key=key,
                generation=assignment.generation,
                state="store_failed",
                message=f"store failed: {exc}"[:1024],
            )
            self._last_heartbeat = -float("inf")
            return
        fence = None
        if assignment.lease_key is not None:
            fence = LeaseFence(
                store, assignment.lease_key, assignment.generation, self.settings.name
            )
        ledger_key = f"{key}#{len(self.runners)}"  # one per run: a re-run starts from zero
        on_record = asyncio.Event()
        engine = SharedEngine(
            self.engine, self.ledger, self.gate, ledger_key, on_record, self.media
        )
        runner = ShardRunner(
            spec,
            MediaGate(engine, spec.engine.media, self.fetchers),
            store,
            input_store,
            fence=fence,
            generation=assignment.generation,
            in_engine=engine.inside,
        )
        self.runners.append(runner)
        if self.on_runner is not None:
            self.on_runner(runner)
        task = asyncio.ensure_future(_run_in_context(runner, assignment.generation))
        task.add_done_callback(lambda _: self._wake.set())
        run = _Run(assignment, runner, task, ledger_key, on_record)
        self._running[key] = run
        self.reports[key] = self._report(key, run, "running")
        # Report the start now, while the runner reads its input: the operator tells started
        # shards (preemption candidates, charged an attempt if the slot dies) from queued ones
        # (which it may give to another slot, or back without an attempt) by the heartbeat, and
        # no request reaches the engine before that heartbeat is written.
        self._last_heartbeat = -float("inf")

    def _reap(self) -> None:
        """Collect ended shard runs; a crashed run re-raises (the process ends UNEXPECTED)."""
        for key, run in list(self._running.items()):
            if not run.task.done():
                continue
            del self._running[key]
            outcome = run.task.result()
            self.outcomes.append(outcome)
            self.reports[key] = self._report(key, run, _STATE[outcome])
            self._last_heartbeat = -float("inf")  # report the end now: its seat frees sooner
            if not self._running:
                self._idle_since = self.clock()

    def _report(self, key: str, run: _Run, state: ShardState) -> ShardReport:
        return ShardReport(
            key=key,
            generation=run.assignment.generation,
            state=state,
            completed=run.runner.stats.completed,
            failed=run.runner.stats.failed,
            busy_seconds=round(self.ledger.share(run.ledger_key), 3),
            message=run.runner.message if state != "running" else None,
            counts_attempt=run.runner.counts_attempt,
            crash_suspects=run.runner.crash_suspects,
            media_in_flight=self.media.named(run.ledger_key) if state == "running" else [],
        )

    def _engine_failed(self) -> bool:
        return Outcome.ENGINE_FAILED in self.outcomes

    def _finished(self, assigned: dict[str, Assignment]) -> bool:
        """Whether the loop ends: stopped, engine broken, drained, or idle long enough."""
        if self._running:
            if self._engine_failed():
                # The engine they share broke under another run: each ends as an engine failure
                # of its own (what it had inside is suspect), not as a stop, whichever of the
                # two it would have noticed first.
                reason = self.engine.dead_reason() or "the engine failed under another shard"
                for run in self._running.values():
                    run.runner.engine_broke(reason)
            return False
        if self._stopping or self._engine_failed() or self._draining:
            return True
        runnable = [k for k, a in assigned.items() if not self._ended(k, a)]
        if runnable:
            return False
        if self.source.fixed:
            return True
        return self._idle_out and not self._kept

    def _idle_for(self) -> float:
        return self.clock() - self._idle_since

    async def _heartbeat(self, *, final: bool = False) -> bool:
        """Renew the leases (a new ``seq``) every ``heartbeat_seconds``, and at once when a shard
        run has started or ended, so the scheduler settles it and fills its seat without
        waiting. False when one was due and could not be written."""
        now = self.clock()
        if not final and now - self._last_heartbeat < self.settings.heartbeat_seconds:
            return True
        self._last_heartbeat = now
        named = self.media.snapshot()
        self._seq = max(self._seq + 1, int(self.wall() * 1000))
        busy = self.ledger.busy_seconds()
        heartbeat = SlotHeartbeat(
            slot=self.settings.name,
            seq=self._seq,
            state="exited" if final else "draining" if self._draining else "ready",
            engine_starts=1,
            concurrency=self.settings.concurrency,
            started_at=self.started_at,
            ready_at=self.ready_at_wall,
            busy_seconds=round(busy, 3),
            idle_seconds=round(max(0.0, now - self.ready_at - busy), 3),
            shards=[self._live_report(key, report) for key, report in sorted(self.reports.items())],
        )
        try:
            await self.source.report(heartbeat)
        except StoreError as exc:
            log.warning("slot %s: heartbeat not written: %s", self.settings.name, exc)
            waiting = any(not run.on_record.is_set() for run in self._running.values())
            if waiting or self.media.waiting:
                self._last_heartbeat = -float("inf")  # runs wait for it: again next loop
            return False
        self.media.recorded(named)
        return True

    def _live_report(self, key: str, report: ShardReport) -> ShardReport:
        run = self._running.get(key)
        if run is None:
            return report
        return self._report(key, run, "running")
