"""Where waiting shards go in a pool of warm slots (pure: data in, decisions out).

The queue order is :func:`llmbatch.core.scheduling.order_queue` (tier, the tenant furthest below
its fair share, round-robin across its batches, creation time). The head of the queue goes to a
slot with room — one whose engine is loaded first, the fullest first, so small batches pack onto
one engine and idle slots can time out — and only when no slot has room does a new slot start,
as long as the autoscaler's desired count allows it. What still waits then queues on a loaded
slot (its ``queue``), to start there the moment one of its seats frees, without waiting for the
next round: a seat that frees between rounds is never idle while work waits. Queued shards go
back to the pool when another slot has a seat free or a better tier needs its place
(:attr:`Placement.take_back`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmbatch.api.slot import Assignment
from llmbatch.core.scheduling import QueuedShard, Shares, split_queue
from llmbatch.core.tiers import TIER_RANK

#: Shards a slot runs at once when the pool does not say (see :func:`slot_concurrency`).
MAX_DEFAULT_CONCURRENCY = 8
#: Shards a slot takes beyond its concurrency for expedited work only: an expedited batch starts
#: at once on a full slot, its requests overtaking the queued ones inside the engine (priority
#: scheduling), instead of waiting for a seat to free or for preemption.
EXPRESS_SEATS = 1


def start_order(assignment: Assignment) -> tuple[int, float]:
    """The order in which a slot starts the shards assigned to it: best tier first, then the
    oldest assignment (so the last in this order waits longest for a seat)."""
    return (TIER_RANK[assignment.shard.tier], assignment.assigned_at)


def seats(concurrency: int, tier: str) -> int:
    """Shards a slot of ``concurrency`` may hold when it is given one more of ``tier``."""
    return concurrency + (EXPRESS_SEATS if tier == "expedited" else 0)


def slot_concurrency(configured: int | None, max_num_seqs: int) -> int:
    """The pool's ``slotConcurrency``, else one shard per 8 engine sequences (1..8): each shard
    keeps ``2 x max_num_seqs`` requests in flight, so a few shards already fill the engine."""
    if configured is not None:
        return configured
    return max(1, min(MAX_DEFAULT_CONCURRENCY, max_num_seqs // 8))


@dataclass(frozen=True)
class SlotView:
    """What the scheduler knows of one slot this round."""

    name: str
    load: int
    """Shards assigned to it and not yet ended."""
    capacity: int
    ready: bool
    """Its engine is loaded (it has sent a ready heartbeat)."""
    open: bool = True
    """It takes new work (not draining, exited or lapsed)."""
    model: str = ""
    """The model its engine serves."""
    queued_tiers: tuple[str, ...] = ()
    """The tiers of the shards of ``load`` it has not started yet."""
    queue: int = 0
    """Shards it may hold queued beyond its capacity (a loaded slot's queue; 0: none)."""

    @property
    def waiting_for_seat(self) -> list[int]:
        """The tier ranks of its queued shards that wait for a seat, best first. A slot starts
        its queued shards best tier first, each while fewer run than its seats for that tier
        (:func:`seats`: an expedited one has the express seat too), so these are the ones left
        over; a shard granted to a free seat and not started yet waits for nothing, and neither
        does an expedited one granted to a free express seat."""
        running = self.load - len(self.queued_tiers)
        waiting = []
        for tier in sorted(self.queued_tiers, key=lambda t: TIER_RANK[t]):
            if running < seats(self.capacity, tier):
                running += 1
            else:
                waiting.append(TIER_RANK[tier])
        return waiting


@dataclass
class Placement:
    """One round's decisions."""

    assign: list[tuple[QueuedShard, str]] = field(default_factory=list)
    """Shards for existing slots: (shard, slot name)."""
    new_slots: list[list[QueuedShard]] = field(default_factory=list)
    """Shards for each slot to start now (all of one model)."""
    waiting: list[QueuedShard] = field(default_factory=list)
    """Shards left in the queue (no room, no slot to start)."""
    capped: list[QueuedShard] = field(default_factory=list)
    """Shards no seat may take: their tenant holds its maximum seats (``core.scheduling``)."""
    take_back: dict[str, int] = field(default_factory=dict)
    """Queued shards to take back from a slot unstarted, its worst tier last-assigned first: a
    better tier takes their place, or a seat is free elsewhere. (A slot that stops taking work
    because its pool changed gives back what it has not started itself: ``SlotFleet.retire``.)"""


def place(
    queued: Iterable[QueuedShard],
    slots: Sequence[SlotView],
    desired: int,
    capacity: int,
    shares: Shares | None = None,
) -> Placement:
    """Give the queue head to slots with room, then to new slots up to ``desired`` open slots.

    A slot has room for a shard while it holds fewer than its capacity; an expedited shard that
    finds no such slot takes the express seat of a full one (:func:`seats`). What is left joins
    the queue of a loaded slot (:attr:`SlotView.queue`), else waits.
    """
    result = Placement()
    load = {s.name: s.load for s in slots if s.open}
    seated = {s.name: s.load - len(s.waiting_for_seat) for s in slots if s.open}
    ranked = sorted(
        (s for s in slots if s.open), key=lambda s: (not s.ready, s.capacity - s.load, s.name)
    )
    startable = max(0, desired - sum(1 for s in slots if s.open))
    unplaced: list[QueuedShard] = []
    ordered, result.capped = split_queue(queued, shares)
    for shard in ordered:
        fits = [s for s in ranked if s.model == shard.model]
        # A seat, else the express seat of a full slot: queued shards do not take it (a slot
        # starts an expedited shard before its queued ones).
        slot = next((s for s in fits if load[s.name] < s.capacity), None) or next(
            (s for s in fits if seated[s.name] < seats(s.capacity, shard.tier)), None
        )
        filling = next(
            (g for g in result.new_slots if g[0].model == shard.model and len(g) < capacity), None
        )
        if slot is not None:
            load[slot.name] += 1
            seated[slot.name] += 1
            result.assign.append((shard, slot.name))
        elif filling is not None:
            filling.append(shard)
        elif len(result.new_slots) < startable:
            result.new_slots.append([shard])
        else:
            unplaced.append(shard)
    _queue(unplaced, [s for s in ranked if s.ready], load, result)
    _rebalance(slots, load, result)
    return result


@dataclass(frozen=True)
class Saturation:
    """What a round that placed nothing proves about the next round from the same slots: a
    new shard of a model whose shards waited at a tier as good as its own, or better, waits
    too. Nothing it could take changed (no seat, express seat aside; no queue room; no queued
    shard of a worse tier to displace; no slot to start), and a shard that joins the queue
    does not change any of it. The pool adds what the placement does not know: no slot may
    start for a deeper backlog (it is at its maximum) and no preemption depends on who waits."""

    waited: Mapping[str, int]
    """Per model (:attr:`QueuedShard.model`), the best tier rank of its shards left waiting."""

    def holds(self, shard: QueuedShard) -> bool:
        """Whether ``shard`` would wait too. Never an expedited one: it may take the express
        seat of a full slot, or preempt."""
        best = self.waited.get(shard.model)
        return shard.tier != "expedited" and best is not None and TIER_RANK[shard.tier] >= best


def saturation(placement: Placement) -> Saturation | None:
    """The saturation a placement proves, or None when it placed or took back anything (the
    slots change: the next round decides again) or left nothing but expedited work waiting."""
    if placement.assign or placement.new_slots or placement.take_back:
        return None
    waited: dict[str, int] = {}
    for shard in placement.waiting:
        if shard.tier != "expedited":
            rank = TIER_RANK[shard.tier]
            waited[shard.model] = min(rank, waited.get(shard.model, rank))
    return Saturation(waited) if waited else None


def _queue(
    shards: list[QueuedShard], loaded: list[SlotView], load: dict[str, int], result: Placement
) -> None:
    """Queue what no seat or new slot took (in queue order) on a loaded slot of its model: the
    one with the fewest queued, so that it starts soonest; with no room left, in the place of a
    queued shard of a lower tier, which goes back to the pool. Expedited shards never queue:
    express seats and preemption serve them sooner."""
    yieldable = {s.name: s.waiting_for_seat for s in loaded}
    for shard in shards:
        of_model = [s for s in loaded if s.model == shard.model]
        room = [s for s in of_model if load[s.name] < s.capacity + s.queue]
        rank = TIER_RANK[shard.tier]
        worse = [s for s in of_model if yieldable[s.name] and yieldable[s.name][-1] > rank]
        if shard.tier == "expedited" or not (room or worse):
            result.waiting.append(shard)
        elif room:
            queue = min(room, key=lambda s: (load[s.name] - s.capacity, s.name))
            load[queue.name] += 1
            result.assign.append((shard, queue.name))
        else:
            queue = max(worse, key=lambda s: (yieldable[s.name][-1], s.name))
            yieldable[queue.name].pop()
            result.take_back[queue.name] = result.take_back.get(queue.name, 0) + 1
            result.assign.append((shard, queue.name))


def _rebalance(slots: Sequence[SlotView], load: dict[str, int], result: Placement) -> None:
    """Queued shards that should run elsewhere: while nothing of its model waits, one for each
    free seat of a loaded slot, from the slot with the most waiting for a seat. The next round
    places them on the free seats."""
    back = result.take_back
    waiting_models = {q.model for q in result.waiting}
    open_slots = [s for s in slots if s.open]
    for model in sorted({s.model for s in open_slots} - waiting_models):
        of_model = [s for s in open_slots if s.model == model]
        free = sum(max(0, s.capacity - load[s.name]) for s in of_model if s.ready)
        queued = {
            s.name: n for s in of_model if (n := len(s.waiting_for_seat) - back.get(s.name, 0)) > 0
        }
        for _ in range(free):
            if not queued:
                break
            most = max(queued, key=lambda name: (queued[name], name))
            back[most] = back.get(most, 0) + 1
            queued[most] -= 1
            if not queued[most]:
                del queued[most]


@dataclass(frozen=True)
class RunningShard:
    """A shard running on a slot, as a preemption candidate."""

    shard: QueuedShard
    key: str
    """Its assignment key."""
    preemptions: int


def preemption_victims(
    waiting: Sequence[QueuedShard],
    running: Sequence[RunningShard],
    max_per_shard: int,
    stopping: int = 0,
) -> list[RunningShard]:
    """Lower-tier running shards to take back for the expedited shards still waiting.

    One victim per waiting expedited shard, less the ``stopping`` ones already taken back and
    still committing; only shards of a model an expedited shard waits for (their slot's engine
    serves it). Lowest tier first; within a tier the newest batch, which loses the least
    progress. A shard is taken back at most ``max_per_shard`` times, so nothing is requeued
    forever.
    """
    expedited = [s for s in waiting if s.tier == "expedited"]
    models = {s.model for s in expedited}
    candidates = [
        r
        for r in running
        if r.shard.tier != "expedited" and r.preemptions < max_per_shard and r.shard.model in models
    ]
    candidates.sort(key=lambda r: (-TIER_RANK.get(r.shard.tier, 9), -r.shard.created_at))
    return candidates[: max(0, len(expedited) - stopping)]


class Liveness:
    """When each slot of one pool last showed a new heartbeat, on the operator's clock, counting
    only time in which the operator could read the pool's channels.

    A slot lapses after ``lease_seconds`` without a new heartbeat ``seq``. Node clocks never
    count (skew cannot expire or extend a lease). Neither does the operator's own blindness: a
    gap between two successful readings of the channels longer than ``slack`` (the store was
    down, the operator stalled or restarted its watch) is added to every slot's time, so a
    store outage of minutes does not mark every slot lost on the first round that reads again
    — their heartbeats could not be written either, and the runners survive it. A slot that
    never sent a heartbeat has not started its process: :meth:`lapsed` is False for it (its
    Job and the start bound decide, ``unstarted``).
    """

    def __init__(self, lease_seconds: float, slack: float) -> None:
        self.lease_seconds = lease_seconds
        self.slack = slack
        self._seen: dict[str, tuple[int, float]] = {}
        self._first: dict[str, float] = {}
        self._looked: float | None = None

    def look(self, now: float) -> None:
        """Every channel of the pool was read at ``now``: credit the time since the last
        reading beyond ``slack`` to every slot."""
        if self._looked is not None:
            blind = now - self._looked - self.slack
            if blind > 0:
                self._seen = {slot: (seq, at + blind) for slot, (seq, at) in self._seen.items()}
                self._first = {slot: at + blind for slot, at in self._first.items()}
        self._looked = now

    def beat(self, slot: str, seq: int | None, now: float) -> bool:
        """Note the slot's heartbeat ``seq`` (None: none yet); True when it is new."""
        self._first.setdefault(slot, now)
        if seq is None:
            return False
        seen = self._seen.get(slot)
        if seen is not None and seen[0] == seq:
            return False
        self._seen[slot] = (seq, now)
        return True

    def lapsed(self, slot: str, now: float) -> bool:
        """No new heartbeat for ``lease_seconds`` of time the operator could see."""
        seen = self._seen.get(slot)
        return seen is not None and now - seen[1] > self.lease_seconds

    def unstarted(self, slot: str, now: float) -> float:
        """Seconds of seen time the slot has existed without a heartbeat (0 once it has one)."""
        if slot in self._seen:
            return 0.0
        return now - self._first.get(slot, now)

    def suspended(self, slot: str, now: float) -> None:
        """The slot's Job waits for admission (``spec.suspend``): it has no pod to start, so
        its start time begins when it is resumed, not when it was created."""
        if slot not in self._seen:
            self._first[slot] = now

    def forget(self, slot: str) -> None:
        self._seen.pop(slot, None)
        self._first.pop(slot, None)
