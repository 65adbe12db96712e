"""Settling a pool's shard runs that ended: each one's end folded into its lease.

Each round, for every assignment of every slot: a stale grant is revoked; a run the slot
reports ended (done, preempted, failed), or one lost with its slot, is settled on its lease by
the one rule of ``core.leases.settle`` and then revoked; a shard whose batch is stopping is
taken back; the rest are held. A lease that cannot be parsed (a peer of another version) is
reported and left alone, never a crashed round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pydantic import ValidationError

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.slot import Assignment, ShardLease, ShardReport
from llmbatch.controller import metrics
from llmbatch.controller.slotstate import ObservedSlot, SlotRound, Work, lease_key
from llmbatch.core.leases import RunEnd, settle
from llmbatch.core.oomblame import (
    MEDIA_OUT_OF_MEMORY,
    MediaVerdict,
    blame_out_of_memory,
    out_of_memory_end,
)
from llmbatch.core.slots import RunningShard
from llmbatch.core.workqueue import Priority
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.shardresults import read_progress, record_blame
from llmbatch.storage.slotchannel import read_lease, update_lease

log = logging.getLogger("llmbatch.controller.slots")


class Settlement:
    """Folds ended runs into leases (store calls only: run in the round's threads)."""

    def __init__(self, store: ObjectStore, clock: Callable[[], float]) -> None:
        self.store = store
        self.clock = clock
        self._reported: set[str] = set()

    def settle(
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
        if slot.unreadable and slot.lost is None:  # what it runs is unknown: it keeps it all
            return set(slot.assignments), running
        if slot.lost is None:
            held |= slot.running()
        reports = {r.key: r for r in slot.heartbeat.shards} if slot.heartbeat else {}
        started = slot.running()
        for key, assignment in list(slot.assignments.items()):
            try:
                lease = self._settle_one(pool, slot, key, assignment, reports, work, result)
            except StoreError as exc:  # this shard's keys: it waits for the next round
                log.warning("shard %s: not settled this round: %s", key, exc)
                held.add(key)
                continue
            if lease is not None:
                held.add(key)
                if key in started and key in work:  # a queued shard frees no seat when taken
                    running.append(RunningShard(work[key].queued, key, lease.preemptions))
        return held, running

    def _settle_one(
        self,
        pool: BatchPoolSpec,
        slot: ObservedSlot,
        key: str,
        assignment: Assignment,
        reports: dict[str, ShardReport],
        work: dict[str, Work],
        result: SlotRound,
    ) -> ShardLease | None:
        """Settle or take back one assignment; its lease while the slot still holds it."""
        try:
            lease = read_lease(self.store, lease_key(assignment))
        except ValidationError as exc:
            self._unreadable_lease(slot, key, exc, result)
            return ShardLease(generation=assignment.generation, slot=slot.name)  # as it was
        if lease is None or (lease.generation, lease.slot) != (assignment.generation, slot.name):
            slot.revoke(key)  # a stale grant
            return None
        report = reports.get(key)
        ended = None if report is None or report.generation != assignment.generation else report
        if ended is not None and ended.state != "running":
            # Taken back once recorded; a lease changed meanwhile waits for next round.
            end = RunEnd(
                ended.state, slot.name, ended.message, ended.counts_attempt, ended.crash_suspects
            )
            if self._end_run(pool, assignment, lease, end, work, result):
                slot.revoke(key)
            return None
        if slot.lost is not None:
            end = RunEnd(lost_run_state(slot, started=ended is not None), slot.name, slot.lost)
            verdicts = media_verdicts(slot)
            if verdicts is not None and end.state != "preempted":
                end = self._blame(assignment, end, verdicts.get(key))
            self._end_run(pool, assignment, lease, end, work, result)
            return None
        if key not in work:  # the batch is stopping (cancel, expiry, pool deleted)
            slot.revoke(key)
            return None
        return lease

    def _blame(self, assignment: Assignment, end: RunEnd, verdict: MediaVerdict | None) -> RunEnd:
        """Record what a slot killed for memory is laid at beside the shard's results (store
        call), and the run's end that charges the shard nothing more."""
        if verdict is not None:
            blamed = dict.fromkeys(verdict.blamed, MEDIA_OUT_OF_MEMORY)
            record_blame(self.store, assignment.shard.output_prefix, blamed, set(verdict.suspects))
        return out_of_memory_end(end, verdict)

    def _unreadable_lease(
        self, slot: ObservedSlot, key: str, exc: ValidationError, result: SlotRound
    ) -> None:
        """A lease this operator cannot parse: counted, reported once, left as it is."""
        metrics.SLOT_MESSAGES_UNREADABLE.labels(slot.pool, "lease").inc()
        if key in self._reported:
            return
        self._reported.add(key)
        why = exc.errors()[0].get("msg")
        log.warning("shard %s: unreadable lease: %s", key, why)
        message = f"The lease of shard {key} cannot be read ({why}): left as it is"
        result.events.append(("Warning", "UnreadableMessage", message[:1024]))

    def _end_run(
        self,
        pool: BatchPoolSpec,
        assignment: Assignment,
        lease: ShardLease,
        end: RunEnd,
        work: dict[str, Work],
        result: SlotRound,
    ) -> bool:
        """Record how a run of a shard ended on its lease (``core.leases.settle``): done, back
        to the queue, or failed. False when the lease changed since this round read it."""
        if end.state == "done":
            end = self._verify_done(assignment, lease, end, work, result)
        after = settle(lease, end, pool.executor.backoff_limit)
        if after is None:
            return True  # nothing to record (the run had lost its lease)
        recorded = self._update(assignment, lease, after)
        if recorded:
            result.touch(assignment.shard.batch_uid, Priority.SHARDS)
        if recorded and after.reason:
            log.warning(
                "shard %s: %s (%s), attempt %d",
                assignment.key,
                after.reason,
                end.message,
                after.attempts,
            )
        return recorded

    def _verify_done(
        self,
        assignment: Assignment,
        lease: ShardLease,
        end: RunEnd,
        work: dict[str, Work],
        result: SlotRound,
    ) -> RunEnd:
        """A run that says done is done when its progress record covers every request; else
        it ended incomplete (a failure: the shard runs again)."""
        shard = assignment.shard
        progress = read_progress(self.store, shard.output_prefix)
        item = work.get(assignment.key)
        covered = 0 if progress is None else progress.completed + progress.failed
        if (
            progress is not None
            and progress.done
            and (item is None or covered >= item.queued.requests)
        ):
            if item is not None:
                result.learned.append((item.queued.requests, progress.busy_seconds))
            result.run_seconds.append(max(0.0, self.clock() - lease.granted_at))
            return end
        metrics.SHARD_INCOMPLETE.inc()
        missing = (item.queued.requests if item else covered) - covered
        message = (
            f"shard {shard.shard_index} ended done with {max(missing, 0)} requests without a result"
        )
        return RunEnd("incomplete", end.slot, message)

    def _update(self, assignment: Assignment, seen: ShardLease, after: ShardLease) -> bool:
        """Move the shard's lease from what this round ``seen`` to ``after`` by a compare-and-
        swap (finalisation may have fenced it meanwhile); True when it is at ``after`` now —
        written by this call, or by an earlier one whose answer was lost."""
        landed = False

        def change(current: ShardLease | None) -> ShardLease | None:
            nonlocal landed
            landed = current == after
            return after if current == seen else None

        return update_lease(self.store, lease_key(assignment), change) is not None or landed


def media_verdicts(slot: ObservedSlot) -> dict[str, MediaVerdict] | None:
    """``core.oomblame``'s verdict on a slot killed for memory, from its last heartbeat; None
    when it was not, or named no request with media."""
    if not slot.out_of_memory or slot.heartbeat is None:
        return None
    named = {r.key: r.media_in_flight for r in slot.heartbeat.shards if r.state == "running"}
    return blame_out_of_memory(named)


def lost_run_state(slot: ObservedSlot, *, started: bool) -> str:
    """How a run ended whose slot is gone without reporting its end.

    A run the slot never reported started (queued: a slot sends a run's requests to its engine
    only once a heartbeat has said so) goes back without blame, as does everything of a slot
    that exited by itself or never started. A started run of a slot whose Job failed, or every
    run of one whose engine never loaded (it would fail anywhere), failed with its slot; a
    started run of a slot that went silent was lost with it."""
    job_failed = slot.lost is not None and slot.lost.startswith("slot Job failed")
    loaded = slot.heartbeat is not None and slot.heartbeat.ready_at is not None
    if job_failed and (started or not loaded):
        return "slot_failed"
    if slot.exited or not started:
        return "preempted"
    return "lost"
