"""The warm slots of one pool: their Jobs, their channels, and the shards placed on them.

One round per call (the pool timer): observe every slot (its Job, heartbeat and assignments),
settle the shard runs that ended (done, preempted, failed, or lost with their slot), then give
the queue head to slots with room and start new slots only for what the drain targets need
(``core.slots.place``). All state lives in the store and on the Jobs: per shard its lease
(``api.slot.ShardLease``), per slot its channel; only when a heartbeat last changed is kept in
memory, and a restarted operator simply starts timing again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import OPEN_LEASE_STATES, Assignment, ShardLease, SlotHeartbeat
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import slot_revision
from llmbatch.controller.kube import Kube
from llmbatch.controller.slotfleet import ANNOTATION_MODEL, ANNOTATION_REVISION, SlotFleet
from llmbatch.controller.slotstate import (
    ObservedSlot,
    SlotRound,
    Work,
    job_ended,
    lease_key,
    max_num_seqs,
    pool_work,
    slot_views,
)
from llmbatch.core import keys
from llmbatch.core.scheduling import QueuedShard
from llmbatch.core.slots import (
    Placement,
    RunningShard,
    lease_lapsed,
    place,
    preemption_victims,
    slot_concurrency,
    start_order,
)
from llmbatch.storage.base import ObjectStore
from llmbatch.storage.shardresults import read_progress
from llmbatch.storage.slotchannel import SlotChannel, grant_lease, read_lease, update_lease

log = logging.getLogger("llmbatch.controller.slots")

T = TypeVar("T")
#: Threads of the pool rounds' store calls (a phase runs a call per slot or grant at once).
ROUND_THREADS = 16


#: The Event reason of a run that ended early, by the state it ended in.
_REASONS = {
    "engine_failed": "EngineFailed",
    "store_failed": "StoreFailed",
    "lost": "SlotLost",
    "slot_failed": "SlotFailed",
    "ShardIncomplete": "ShardIncomplete",
}


def _read_channel(channel: SlotChannel) -> tuple[SlotHeartbeat | None, dict[str, Assignment]]:
    return channel.heartbeat(), channel.assignments()


class SlotScheduler:
    """Places shards on the warm slots of a pool, one round per call."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.store = store
        self.config = config
        self.clock = clock
        self._seen: dict[str, tuple[int, float]] = {}
        self._times: dict[str, tuple[float, float]] = {}
        self._known_waiting: dict[str, set[str]] = {}  # pool -> shards waiting at its last round
        self.fleet = SlotFleet(kube, store, config, self._forget)
        # The round's own threads: in the shared pool its few calls would queue behind the
        # store calls of every batch's reconcile, hundreds of them under load.
        self._threads = ThreadPoolExecutor(ROUND_THREADS, thread_name_prefix="pool-round")

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (store calls) in one of the round's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    async def round(
        self,
        name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        batches: list[dict[str, Any]],
        desired: int,
        now: float,
    ) -> SlotRound:
        """One round over the pool's slots; ``batches`` is this round's listing of Batches."""
        result = SlotRound()
        namespace = pool.worker_namespace
        work = pool_work(name, batches)
        slots = await self._observe_all(name, pool, now)
        # The store calls of a phase run in the round's threads, a slot (or a grant) each, all
        # at once: one by one, a round of 64 seats took seconds under load.
        settled = await asyncio.gather(
            *(self._io(self._settle, pool, slot, work, result) for slot in slots)
        )
        held = {key for slot_held, _ in settled for key in slot_held}
        running = [run for _, slot_running in settled for run in slot_running]
        for slot in slots:
            if slot.lost is not None:
                await self.fleet.remove(namespace, slot)
            elif slot.outdated:
                await self.fleet.retire(namespace, slot, result)
        live = [s for s in slots if s.lost is None]
        candidates = [w for w in work.values() if w.key not in held]
        waiting = await self._io(self._waiting, name, candidates)
        capacity = slot_concurrency(pool.slot_concurrency, max_num_seqs(pool))
        views = slot_views(live, capacity, pool.slot_queue)
        placement = place((w.queued for w in waiting), views, desired, capacity)
        await self._carry_out(name, pool, pool_uid, placement, waiting, now, result)
        if pool.preemption == "LowerPriority" and placement.waiting:
            await self._preempt(name, pool, live, running, placement.waiting, result)
        if placement.take_back:
            await self._io(self._take_back_queued, name, live, placement.take_back)
        result.waiting = placement.waiting
        assigned = {slot for _, slot in placement.assign}
        busy = assigned | {v.name for v in views if v.load}
        waiting_models = {q.model for q in placement.waiting}
        kept = await self.fleet.keep_warm(pool, live)
        prestarted = await self.fleet.prestart(
            name, pool, pool_uid, live, placement, now, self._assign, result
        )
        if waiting_models and sum(1 for s in live if s.open) >= pool.max_slots:
            kept = set()  # a full pool: a kept idle slot of another model is in the way
        await self.fleet.scale_down(namespace, live, busy, desired, waiting_models, kept, result)
        result.warm = sum(1 for s in live if s.open) + len(placement.new_slots) + prestarted
        result.busy = len(busy) + len(placement.new_slots)
        return result

    async def _carry_out(
        self,
        name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        placement: Placement,
        waiting: list[Work],
        now: float,
        result: SlotRound,
    ) -> None:
        """Grant the shards placed on slots (all at once) and start the new slots."""
        by_shard = {id(w.queued): w for w in waiting}
        await asyncio.gather(
            *(
                self._io(self._grant, name, slot_name, by_shard[id(shard)], now)
                for shard, slot_name in placement.assign
            )
        )
        for group in placement.new_slots:
            started = await self.fleet.start(
                name, pool, pool_uid, [by_shard[id(q)] for q in group], now, self._assign
            )
            result.events.append(
                ("Normal", "SlotStarted", f"Started slot {started} for {len(group)} shards")
            )

    async def _observe_all(self, name: str, pool: BatchPoolSpec, now: float) -> list[ObservedSlot]:
        """Every slot of the pool that is not being deleted: its Job, heartbeat, assignments."""
        jobs = await self.fleet.jobs(name, pool.worker_namespace, now)
        jobs = [job for job in jobs if not job["metadata"].get("deletionTimestamp")]
        # What a slot of each model looks like now: computed once a round, not once a slot.
        revisions = {m.name: slot_revision(self.config, pool, m.name) for m in pool.models}
        channels = [
            SlotChannel(self.store, keys.slot_prefix(name, job["metadata"]["name"])) for job in jobs
        ]
        reads = await asyncio.gather(*(self._io(_read_channel, c) for c in channels))
        return [
            self._observe(name, revisions, job, channel, heartbeat, assignments, now)
            for job, channel, (heartbeat, assignments) in zip(jobs, channels, reads, strict=True)
        ]

    def forget_pool(self, name: str) -> None:
        """Drop what is remembered of a deleted pool (its slots were forgotten one by one)."""
        self._known_waiting.pop(name, None)

    def _forget(self, slot: str) -> None:
        self._seen.pop(slot, None)
        self._times.pop(slot, None)

    # --- observing ---------------------------------------------------------------------------

    def _observe(
        self,
        pool_name: str,
        revisions: dict[str, str | None],
        job: dict[str, Any],
        channel: SlotChannel,
        heartbeat: SlotHeartbeat | None,
        assignments: dict[str, Assignment],
        now: float,
    ) -> ObservedSlot:
        name = job["metadata"]["name"]
        seen = self._seen.get(name)
        if heartbeat is not None and (seen is None or seen[0] != heartbeat.seq):
            self._seen[name] = seen = (heartbeat.seq, now)
            self._count_time(pool_name, name, heartbeat)
        lost = job_ended(job)
        exited = lost == "slot Job complete"
        if lost is None and lease_lapsed(
            seen[1] if seen else None, now, self.config.slot_lease_seconds
        ):
            lost = f"no heartbeat for {self.config.slot_lease_seconds:g} s"
        annotations = job["metadata"].get("annotations") or {}
        model = annotations.get(ANNOTATION_MODEL, "")
        outdated = annotations.get(ANNOTATION_REVISION) != revisions.get(model)
        return ObservedSlot(
            name, pool_name, model, channel, heartbeat, assignments, lost, exited, outdated
        )

    def _count_time(self, pool_name: str, slot: str, heartbeat: SlotHeartbeat) -> None:
        """Busy and idle slot-seconds, from the growth of the heartbeat's running totals."""
        before = self._times.get(slot, (0.0, 0.0))
        self._times[slot] = (heartbeat.busy_seconds, heartbeat.idle_seconds)
        for state, value, old in (
            ("busy", heartbeat.busy_seconds, before[0]),
            ("idle", heartbeat.idle_seconds, before[1]),
        ):
            if value > old:  # a restarted slot process starts its totals again from zero
                metrics.SLOT_SECONDS.labels(pool_name, state).inc(value - old)

    def _waiting(self, pool_name: str, candidates: list[Work]) -> list[Work]:
        """The shards no slot holds that wait for one (not done, not given up). A shard found
        waiting in the last round and not granted since is still waiting (only this operator
        moves a lease on, and a grant refuses a lease that finalisation fenced), so only the
        others' leases are read: a long queue costs no store reads per round."""
        known = self._known_waiting.get(pool_name, set())
        waiting = [work for work in candidates if work.key in known or self._queued(work)]
        self._known_waiting[pool_name] = {work.key for work in waiting}
        return waiting

    def _queued(self, work: Work) -> bool:
        lease = read_lease(self.store, work.lease_key)
        if lease is None:  # never placed: queued once the batch has written its spec
            return self.store.head(work.spec_key) is not None
        return lease.state in OPEN_LEASE_STATES

    # --- settling ended runs -----------------------------------------------------------------

    def _settle(
        self,
        pool: BatchPoolSpec,
        slot: ObservedSlot,
        work: dict[str, Work],
        result: SlotRound,
    ) -> tuple[set[str], list[RunningShard]]:
        """Fold the slot's ended runs into their leases and take back what must stop; the
        shards the slot still holds and its running ones (preemption candidates). What is taken
        back leaves the slot's observed assignments too, so its seat is filled in this same
        round. Runs in a worker thread (store calls only; the round awaits it)."""
        held: set[str] = set()
        running: list[RunningShard] = []
        if slot.lost is None:
            held |= slot.running()
        reports = {r.key: r for r in slot.heartbeat.shards} if slot.heartbeat else {}
        started = slot.running()
        for key, assignment in list(slot.assignments.items()):
            lease = read_lease(self.store, lease_key(assignment))
            if lease is None or (lease.generation, lease.slot) != (
                assignment.generation,
                slot.name,
            ):
                self._revoke(slot, key)  # a stale grant
                continue
            report = reports.get(key)
            ended = None if report is None or report.generation != assignment.generation else report
            if ended is not None and ended.state != "running":
                # Taken back once recorded; a lease changed meanwhile waits for next round.
                if self._end_run(pool, assignment, lease, ended.state, ended.message, work, result):
                    self._revoke(slot, key)
            elif slot.lost is not None:
                # A run the slot never reported started (queued: a slot sends a run's requests
                # to its engine only once a heartbeat has said so) costs no attempt.
                state = "preempted" if slot.exited or ended is None else "lost"
                loaded = slot.heartbeat is not None and slot.heartbeat.ready_at is not None
                if slot.lost.startswith("slot Job failed") and (ended is not None or not loaded):
                    # its pod's retries (backoffLimit) are spent: what it ran, or all it held
                    # when its engine never loaded (it would fail on any slot), fails; a shard
                    # it held queued behind a loaded engine goes back without blame
                    state = "slot_failed"
                self._end_run(pool, assignment, lease, state, slot.lost, work, result)
            elif key not in work:  # the batch is stopping (cancel, expiry, pool deleted)
                self._revoke(slot, key)
            else:
                held.add(key)
                if key in started:  # a queued shard frees no seat when taken back
                    running.append(RunningShard(work[key].queued, key, lease.preemptions))
        return held, running

    @staticmethod
    def _revoke(slot: ObservedSlot, key: str) -> None:
        slot.channel.revoke(key)
        slot.assignments.pop(key, None)

    def _end_run(
        self,
        pool: BatchPoolSpec,
        assignment: Assignment,
        lease: ShardLease,
        state: str,
        message: str | None,
        work: dict[str, Work],
        result: SlotRound,
    ) -> bool:
        """Record how a run of a shard ended on its lease: done, back to the queue, or failed.
        False when the lease changed since this round read it (nothing recorded)."""
        if state == "lease_lost":
            return True
        shard = assignment.shard
        if state == "done":
            progress = read_progress(self.store, shard.output_prefix)
            item = work.get(assignment.key)
            covered = 0 if progress is None else progress.completed + progress.failed
            if (
                progress is not None
                and progress.done
                and (item is None or covered >= item.queued.requests)
            ):
                if not self._update(assignment, lease, state="done", reason=None, message=None):
                    return False
                if item is not None:
                    result.learned.append((item.queued.requests, progress.busy_seconds))
                result.run_seconds.append(max(0.0, self.clock() - lease.granted_at))
                return True
            metrics.SHARD_INCOMPLETE.inc()
            missing = (item.queued.requests if item else covered) - covered
            state, message = (
                "ShardIncomplete",
                (
                    f"shard {shard.shard_index} ended done with {max(missing, 0)} requests "
                    "without a result"
                ),
            )
        if state == "preempted":
            return self._update(assignment, lease, state="released", reason=None, message=None)
        reason = _REASONS.get(state, "ShardFailed")
        attempts = lease.attempts + 1
        give_up = attempts > pool.executor.backoff_limit or state == "slot_failed"
        if give_up:
            message = f"{message or reason}; gave up after {attempts} attempts"
        recorded = self._update(
            assignment,
            lease,
            state="failed" if give_up else "released",
            reason=reason,
            message=(message or reason)[:1024],
            attempts=attempts,
        )
        if recorded:
            log.warning("shard %s: %s (%s), attempt %d", assignment.key, reason, message, attempts)
        return recorded

    def _update(self, assignment: Assignment, seen: ShardLease, **changes: Any) -> bool:
        """Change the shard's lease if it is still as this round ``seen`` it (a compare-and-
        swap: finalisation may have fenced it meanwhile); whether the change was written."""

        def change(current: ShardLease | None) -> ShardLease | None:
            return current.model_copy(update=changes) if current == seen else None

        return update_lease(self.store, lease_key(assignment), change) is not None

    # --- placing -----------------------------------------------------------------------------

    async def _assign(self, pool_name: str, slot: str, work: Work, now: float) -> None:
        await self._io(self._grant, pool_name, slot, work, now)

    def _grant(self, pool_name: str, slot: str, work: Work, now: float) -> None:
        """Lease the shard to ``slot`` (a new generation fences earlier holders), then assign.
        Store calls only: runs in a worker thread."""
        spec = ShardSpec.model_validate_json(self.store.get(work.spec_key))
        lease = grant_lease(self.store, work.lease_key, slot, now)
        # Granted, or done, failed or fenced since it was found waiting: waiting no longer.
        self._known_waiting.get(pool_name, set()).discard(work.key)
        if lease is None:
            return
        if lease.generation == 1 and work.since:
            metrics.SLOT_ASSIGNMENT_WAIT.labels(pool_name).observe(max(0.0, now - work.since))
        assignment = Assignment(
            shard=spec, lease_key=work.lease_key, generation=lease.generation, assigned_at=now
        )
        SlotChannel(self.store, keys.slot_prefix(pool_name, slot)).assign(assignment)
        metrics.SLOT_ASSIGNMENTS.labels(pool_name).inc()

    async def _preempt(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        slots: list[ObservedSlot],
        running: list[RunningShard],
        waiting: list[QueuedShard],
        result: SlotRound,
    ) -> None:
        """Take lower-tier shards back for expedited ones still waiting: the slot stops feeding
        them and commits what finished; they wait in the queue and resume from their chunks."""
        holders = {key: s for s in slots for key in s.assignments}
        # Shards already taken back and still stopping free their places soon: count them.
        stopping = sum(len(s.running() - s.assignments.keys()) for s in slots)
        victims = preemption_victims(waiting, running, pool.max_preemptions_per_shard, stopping)

        def take_back_all() -> None:
            for victim in victims:
                self._take_back(holders[victim.key], victim.key)

        await self._io(take_back_all)
        for victim in victims:
            slot = holders[victim.key]
            result.events.append(
                (
                    "Normal",
                    "Preempted",
                    f"Took shard {victim.key} back from {slot.name} for expedited work",
                )
            )

    @staticmethod
    def _take_back_queued(pool_name: str, slots: list[ObservedSlot], back: dict[str, int]) -> None:
        """Revoke queued shards the slots have not started, the ones they would start last
        (store calls: in a thread); the next round places them again."""
        for slot in slots:
            count = back.get(slot.name, 0)
            if not count:
                continue
            queued = sorted(slot.queued().items(), key=lambda ka: start_order(ka[1]))
            for key, _ in queued[-count:]:
                SlotScheduler._revoke(slot, key)
                metrics.SLOT_QUEUE_RETURNS.labels(pool_name).inc()

    def _take_back(self, slot: ObservedSlot, key: str) -> None:
        """Count a preemption on the shard's lease (while it is still this run's) and revoke it
        (store calls: in a thread)."""
        assignment = slot.assignments[key]

        def count(lease: ShardLease | None) -> ShardLease | None:
            if lease is None or lease.generation != assignment.generation:
                return None
            return lease.model_copy(update={"preemptions": lease.preemptions + 1})

        update_lease(self.store, lease_key(assignment), count)
        slot.channel.revoke(key)
