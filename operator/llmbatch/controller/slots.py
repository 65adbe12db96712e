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
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pydantic import ValidationError

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import Assignment, ShardLease
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.fairstate import TenantLedger, placed_status
from llmbatch.controller.kube import Kube
from llmbatch.controller.roundcost import counted
from llmbatch.controller.settlement import Settlement
from llmbatch.controller.slotfleet import Assign, SlotFleet
from llmbatch.controller.slotstate import (
    Look,
    ObservedSlot,
    SlotRound,
    Work,
    WorkMemo,
    lease_key,
    max_num_seqs,
    pool_shares,
    slot_views,
    slots_signature,
)
from llmbatch.controller.slotwatch import SlotObserver
from llmbatch.core import keys
from llmbatch.core.fairshare import tenant_preemptions
from llmbatch.core.leases import ENDED_STATES, OPEN_STATES, LeaseEvent, transition
from llmbatch.core.scheduling import QueuedShard, Shares, unserved
from llmbatch.core.slots import (
    Placement,
    RunningShard,
    place,
    preemption_victims,
    saturation,
    slot_concurrency,
    start_order,
)
from llmbatch.core.workqueue import Priority
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.slotchannel import SlotChannel, grant_lease, read_lease, update_lease

log = logging.getLogger("llmbatch.controller.slots")

T = TypeVar("T")
#: Threads of the pool rounds' store calls (a phase runs a call per slot or grant at once).
ROUND_THREADS = 16


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
        self._known_waiting: dict[str, set[str]] = {}  # pool -> shards waiting at its last round
        self._known_ended: dict[str, set[str]] = {}  # pool -> shards whose lease has ended
        self._work = WorkMemo()  # each batch's shards, mapped again when its status changes
        self.fleet = SlotFleet(kube, store, config, lambda slot: self.observer.forget(slot))
        self.observer = SlotObserver(kube, store, config, self.fleet, self._io)
        self.settlement = Settlement(store, clock)
        # The round's own threads: in the shared pool its few calls would queue behind the
        # store calls of every batch's reconcile, hundreds of them under load.
        self._threads = ThreadPoolExecutor(ROUND_THREADS, thread_name_prefix="pool-round")
        self.tenant_weight: Callable[[str], float] = lambda _tenant: 1.0
        """A tenant's fair-share weight (the operator's namespace cache; 1 until it is set)."""
        self.ledger = TenantLedger()

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (store calls) in one of the round's threads."""
        return await asyncio.get_running_loop().run_in_executor(self._threads, counted(fn), *args)

    async def look(self, name: str, pool: BatchPoolSpec, now: float) -> Look:
        """The cheap part of a round: observe the pool's slots (liveness, reports, progress)."""
        result = SlotRound()
        slots = await self.observer.observe(name, pool, now, result)
        return Look(slots, result, slots_signature(slots))

    async def round(
        self,
        name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        batches: list[dict[str, Any]],
        desired: int,
        now: float,
        look: Look | None = None,
    ) -> SlotRound:
        """One round over the pool's slots (``look``: observed already); ``batches`` is the
        pool's running Batches."""
        if look is None:
            look = await self.look(name, pool, now)
        result, slots = look.result, look.slots
        namespace = pool.worker_namespace
        work = self._work.pool_work(name, batches)
        # The store calls of a phase run in the round's threads, a slot (or a grant) each, all
        # at once: one by one, a round of 64 seats took seconds under load.
        settled = await asyncio.gather(
            *(self._io(self.settlement.settle, pool, slot, work, result) for slot in slots)
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
        waiting = await self._withdraw_unserved(name, pool, waiting, result)
        capacity = slot_concurrency(pool.slot_concurrency, max_num_seqs(pool))
        views = slot_views(live, capacity, pool.slot_queue)
        fair = pool.fair_sharing
        usage = self.ledger.advance(
            name, fair.usage_half_life_seconds, Counter(r.shard.tenant for r in running), now
        )
        shares = pool_shares(work, held, self.tenant_weight, fair, usage.seats())
        placement = place((w.queued for w in waiting), views, desired, capacity, shares)
        await self._carry_out(name, pool, pool_uid, placement, waiting, now, result)
        total_seats = sum(v.capacity for v in views if v.open)
        preempted = await self._preemptions(
            name, pool, live, running, placement, shares, total_seats, result
        )
        if placement.take_back:
            await self._io(self._take_back_queued, name, live, placement.take_back)
        result.waiting = placement.waiting + placement.capped
        result.tenants = placed_status(shares, usage, placement, total_seats)
        assigned = {slot for _, slot in placement.assign}
        busy = assigned | {v.name for v in views if v.load}
        waiting_models = {q.model for q in placement.waiting}
        kept = await self.fleet.keep_warm(pool, live)
        prestarted = await self.fleet.prestart(
            name, pool, pool_uid, live, placement, now, self._assigner(result), result
        )
        if waiting_models and sum(1 for s in live if s.open) >= pool.max_slots:
            kept = set()  # a full pool: a kept idle slot of another model is in the way
        await self.fleet.scale_down(namespace, live, busy, desired, waiting_models, kept, result)
        if not (preempted or prestarted) and self._saturable(pool, desired):
            result.saturation = saturation(placement)
        result.warm = sum(1 for s in live if s.open) + len(placement.new_slots) + prestarted
        result.busy = len(busy) + len(placement.new_slots)
        return result

    @staticmethod
    def _saturable(pool: BatchPoolSpec, desired: int) -> bool:
        """Whether a deeper queue leaves the pool's decisions as they are: no slot may start
        for it (the pool is at its maximum) and no preemption across tenants weighs who
        waits (a tenant joining changes every tenant's share)."""
        return desired >= pool.max_slots and pool.fair_sharing.preemption != "BelowGuarantee"

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
                self._io(self._grant, name, slot_name, by_shard[id(shard)], now, result)
                for shard, slot_name in placement.assign
            )
        )
        for group in placement.new_slots:
            started = await self.fleet.start(
                name, pool, pool_uid, [by_shard[id(q)] for q in group], now, self._assigner(result)
            )
            result.events.append(
                ("Normal", "SlotStarted", f"Started slot {started} for {len(group)} shards")
            )

    def forget_pool(self, name: str) -> None:
        """Drop what is remembered of a deleted pool (its slots were forgotten one by one)."""
        self._known_waiting.pop(name, None)
        self._known_ended.pop(name, None)
        self._work.forget_pool(name)
        self.observer.forget_pool(name)
        self.ledger.forget(name)

    def _waiting(self, pool_name: str, candidates: list[Work]) -> list[Work]:
        """The shards no slot holds that wait for one (not done, not given up). A shard found
        waiting in the last round and not granted since is still waiting (only this operator
        moves a lease on, and a grant refuses a lease that finalisation fenced), and one whose
        lease was found ended (done, failed, fenced: no event leaves those) never waits again,
        so only the others' leases are read: neither a long queue nor the shards that finished
        before their batch's status says so cost store reads per round (under a burst, where
        finalising waits behind acceptance, those were most of a round's reads)."""
        known = self._known_waiting.get(pool_name, set())
        ended = self._known_ended.get(pool_name, set())
        waiting: list[Work] = []
        still_ended: set[str] = set()
        for work in candidates:
            if work.key in ended:
                still_ended.add(work.key)
            elif work.key in known:
                waiting.append(work)
            else:
                state = self._lease_state(work)
                if state == "waiting":
                    waiting.append(work)
                elif state in ENDED_STATES:
                    still_ended.add(work.key)
        self._known_waiting[pool_name] = {work.key for work in waiting}
        self._known_ended[pool_name] = still_ended  # forgotten once the batch's status shows it
        return waiting

    def _lease_state(self, work: Work) -> str | None:
        """``waiting`` for a shard that waits for a slot, else its lease's state; None for a
        lease or spec this round cannot read (a store error on that shard's keys, a message of
        another version): it waits for the next round."""
        try:
            lease = read_lease(self.store, work.lease_key)
            if lease is None:  # never placed: queued once the batch has written its spec
                return "waiting" if self.store.head(work.spec_key) is not None else None
        except (StoreError, ValidationError) as exc:
            log.warning("shard %s: not placed this round: %s", work.key, exc)
            return None
        return "waiting" if lease.state in OPEN_STATES else lease.state

    async def _withdraw_unserved(
        self, pool_name: str, pool: BatchPoolSpec, waiting: list[Work], result: SlotRound
    ) -> list[Work]:
        """Give up the waiting shards of models the pool no longer serves (their batches end
        with a ``shard_failed`` line per unrun request, billed for nothing); the rest wait on."""
        served = {model.name for model in pool.models}
        reasons = {id(w): unserved(pool_name, served, w.queued) for w in waiting}
        gone = [w for w in waiting if reasons[id(w)] is not None]
        moved = await asyncio.gather(
            *(self._io(self._withdraw, pool_name, w, str(reasons[id(w)])) for w in gone)
        )
        withdrawn = [work for work, done in zip(gone, moved, strict=True) if done]
        for work in withdrawn:
            result.touch(work.key.rsplit("-", 1)[0], Priority.SHARDS)
        if withdrawn:
            models = ", ".join(sorted({w.queued.model_name for w in withdrawn}))
            result.events.append(
                (
                    "Warning",
                    "ModelRemoved",
                    f"Gave up {len(withdrawn)} waiting shards of {models}, no longer served by"
                    " this pool: their requests end as shard_failed lines",
                )
            )
        return [w for w in waiting if reasons[id(w)] is None]

    def _withdraw(self, pool_name: str, work: Work, reason: str) -> bool:
        """Move a waiting shard's lease to failed (a compare-and-swap: a lease granted or
        fenced meanwhile stays as it is); True when this call did. Store calls only."""
        try:
            moved = update_lease(
                self.store,
                work.lease_key,
                lambda lease: transition(
                    lease, LeaseEvent.WITHDRAW, reason="ModelRemoved", message=reason[:1024]
                ),
            )
        except StoreError as exc:
            log.warning("shard %s: not withdrawn this round: %s", work.key, exc)
            return False
        self._known_waiting.get(pool_name, set()).discard(work.key)
        return moved is not None

    # --- placing -----------------------------------------------------------------------------

    def _assigner(self, result: SlotRound) -> Assign:
        """How the fleet grants a new slot its first shards (this round's grants)."""

        async def assign(pool_name: str, slot: str, work: Work, now: float) -> None:
            await self._io(self._grant, pool_name, slot, work, now, result)

        return assign

    def _grant(self, pool_name: str, slot: str, work: Work, now: float, result: SlotRound) -> None:
        """Lease the shard to ``slot`` (a new generation fences earlier holders), then assign.
        Store calls only: runs in a worker thread. A store error on this shard's keys leaves it
        waiting for the next round (a lease granted without its assignment is granted again
        then), never failing the round for the other shards."""
        try:
            if self._grant_once(pool_name, slot, work, now):
                result.touch(work.key.rsplit("-", 1)[0], Priority.SHARDS)
        except StoreError as exc:
            log.warning("shard %s: not granted to %s this round: %s", work.key, slot, exc)

    def _grant_once(self, pool_name: str, slot: str, work: Work, now: float) -> bool:
        spec = ShardSpec.model_validate_json(self.store.get(work.spec_key))
        lease = grant_lease(self.store, work.lease_key, slot, now)
        # Granted, or done, failed or fenced since it was found waiting: waiting no longer.
        self._known_waiting.get(pool_name, set()).discard(work.key)
        if lease is None:
            return False
        if lease.generation == 1 and work.since:
            metrics.SLOT_ASSIGNMENT_WAIT.labels(pool_name).observe(max(0.0, now - work.since))
        assignment = Assignment(
            shard=spec, lease_key=work.lease_key, generation=lease.generation, assigned_at=now
        )
        SlotChannel(self.store, keys.slot_prefix(pool_name, slot)).assign(assignment)
        metrics.SLOT_ASSIGNMENTS.labels(pool_name).inc()
        return True

    async def _preemptions(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        slots: list[ObservedSlot],
        running: list[RunningShard],
        placement: Placement,
        shares: Shares,
        total_seats: int,
        result: SlotRound,
    ) -> int:
        """Preempt for what still waits, where the pool allows it: lower tiers for expedited
        shards (``preemption: LowerPriority``), else tenants above their share for tenants
        below their guarantee (``fairSharing.preemption: BelowGuarantee``) — never both in one
        round, and not across tenants while a shard taken back is still stopping (its seat
        is about to free). How many it took back."""
        if not placement.waiting:
            return 0
        if pool.preemption == "LowerPriority":
            taken = await self._preempt(pool_name, pool, slots, running, placement.waiting, result)
            if taken:
                return taken
        if pool.fair_sharing.preemption != "BelowGuarantee":
            return 0
        if any(s.running() - s.assignments.keys() for s in slots):
            return 0
        moves = tenant_preemptions(
            placement.waiting, running, shares, total_seats, pool.max_preemptions_per_shard
        )
        holders = {key: s for s in slots for key in s.assignments}

        def take_back_all() -> None:
            for victim, _ in moves:
                self._take_back(holders[victim.key], victim.key)

        await self._io(take_back_all)
        for victim, receiver in moves:
            metrics.TENANT_PREEMPTIONS.labels(pool_name).inc()
            result.touch(victim.key.rsplit("-", 1)[0], Priority.SHARDS)
            result.events.append(
                (
                    "Normal",
                    "Preempted",
                    f"Took shard {victim.key} of tenant {victim.shard.tenant} back from "
                    f"{holders[victim.key].name} for tenant {receiver.tenant}, below its "
                    "guaranteed seats",
                )
            )
        return len(moves)

    async def _preempt(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        slots: list[ObservedSlot],
        running: list[RunningShard],
        waiting: list[QueuedShard],
        result: SlotRound,
    ) -> int:
        """Take lower-tier shards back for expedited ones still waiting: the slot stops feeding
        them and commits what finished; they wait in the queue and resume from their chunks.
        How many it took back."""
        holders = {key: s for s in slots for key in s.assignments}
        # Shards already taken back and still stopping free their places soon: count them.
        stopping = sum(len(s.running() - s.assignments.keys()) for s in slots)
        victims = preemption_victims(waiting, running, pool.max_preemptions_per_shard, stopping)

        def take_back_all() -> None:
            for victim in victims:
                self._take_back(holders[victim.key], victim.key)

        await self._io(take_back_all)
        for victim in victims:
            result.touch(victim.key.rsplit("-", 1)[0], Priority.SHARDS)
            slot = holders[victim.key]
            result.events.append(
                (
                    "Normal",
                    "Preempted",
                    f"Took shard {victim.key} back from {slot.name} for expedited work",
                )
            )
        return len(victims)

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
                slot.revoke(key)
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
