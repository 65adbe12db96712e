"""Where waiting shards go in a pool of warm slots (pure: data in, decisions out).

The queue order is :func:`llmbatch.core.scheduling.order_queue` (tier, round-robin across
batches, creation time). The head of the queue goes to a slot with room — one whose engine is
loaded first, the fullest first, so small batches pack onto one engine and idle slots can time
out — and only when no slot has room does a new slot start, as long as the autoscaler's desired
count allows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from llmbatch.core.scheduling import QueuedShard, order_queue
from llmbatch.core.tiers import TIER_RANK

#: Shards a slot runs at once when the pool does not say (see :func:`slot_concurrency`).
MAX_DEFAULT_CONCURRENCY = 8
#: Shards a slot takes beyond its concurrency for expedited work only: an expedited batch starts
#: at once on a full slot, its requests overtaking the queued ones inside the engine (priority
#: scheduling), instead of waiting for a seat to free or for preemption.
EXPRESS_SEATS = 1


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


@dataclass
class Placement:
    """One round's decisions."""

    assign: list[tuple[QueuedShard, str]] = field(default_factory=list)
    """Shards for existing slots: (shard, slot name)."""
    new_slots: list[list[QueuedShard]] = field(default_factory=list)
    """Shards for each slot to start now (all of one model)."""
    waiting: list[QueuedShard] = field(default_factory=list)
    """Shards left in the queue (no room, no slot to start)."""


def place(
    queued: Iterable[QueuedShard], slots: Sequence[SlotView], desired: int, capacity: int
) -> Placement:
    """Give the queue head to slots with room, then to new slots up to ``desired`` open slots.

    A slot has room for a shard while it holds fewer than its capacity; an expedited shard that
    finds no such slot takes the express seat of a full one (:func:`seats`).
    """
    result = Placement()
    load = {s.name: s.load for s in slots if s.open}
    ranked = sorted(
        (s for s in slots if s.open), key=lambda s: (not s.ready, s.capacity - s.load, s.name)
    )
    startable = max(0, desired - sum(1 for s in slots if s.open))
    for shard in order_queue(queued):
        fits = [s for s in ranked if s.model == shard.model]
        slot = next((s for s in fits if load[s.name] < s.capacity), None) or next(
            (s for s in fits if load[s.name] < seats(s.capacity, shard.tier)), None
        )
        filling = next(
            (g for g in result.new_slots if g[0].model == shard.model and len(g) < capacity), None
        )
        if slot is not None:
            load[slot.name] += 1
            result.assign.append((shard, slot.name))
        elif filling is not None:
            filling.append(shard)
        elif len(result.new_slots) < startable:
            result.new_slots.append([shard])
        else:
            result.waiting.append(shard)
    return result


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


def lease_lapsed(last_seen: float | None, now: float, lease_seconds: float) -> bool:
    """Whether a slot's leases have lapsed: no new heartbeat for ``lease_seconds``, timed by
    the operator's clock from when it last saw the heartbeat change (node clocks never count).

    A slot that never sent one has not started its process (its pod waits for a node or an
    image): its Job's own state tells when it fails.
    """
    return last_seen is not None and now - last_seen > lease_seconds
