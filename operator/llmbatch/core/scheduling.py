"""Which waiting shards get the free slots of a pool.

Order: tier (expedited > standard > flex), then round-robin across the batches of a tier (every
batch's first waiting shard before any batch's second, so one huge batch cannot starve a small
one), then batch creation time, then shard index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmbatch.core.tiers import TIER_RANK


@dataclass(frozen=True)
class QueuedShard:
    """A shard waiting for a slot."""

    batch: str
    """Namespace/name of the batch (a stable identity for round-robin)."""
    tier: str
    created_at: float
    shard_index: int
    requests: int = 0
    model: str = ""
    """The model its batch uses (a slot serves one model)."""


def order_queue(waiting: Iterable[QueuedShard]) -> list[QueuedShard]:
    """The waiting shards in the order they get slots."""
    by_batch: dict[str, list[QueuedShard]] = {}
    for shard in waiting:
        by_batch.setdefault(shard.batch, []).append(shard)
    keyed = []
    for shards in by_batch.values():
        for turn, shard in enumerate(sorted(shards, key=lambda s: s.shard_index)):
            keyed.append(
                (
                    (
                        TIER_RANK.get(shard.tier, len(TIER_RANK)),
                        turn,
                        shard.created_at,
                        shard.batch,
                    ),
                    shard,
                )
            )
    keyed.sort(key=lambda item: item[0])
    return [shard for _, shard in keyed]


def grant_slots(waiting: Iterable[QueuedShard], running: int, capacity: int) -> list[QueuedShard]:
    """The shards to start now: the head of the queue, as many as there are free slots."""
    free = max(0, capacity - running)
    return order_queue(waiting)[:free]
