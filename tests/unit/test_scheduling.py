"""Slot queue ordering: tiers, round-robin across batches, creation time, shard index."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.core.scheduling import TIER_RANK, QueuedShard, grant_slots, order_queue


def shard(batch: str, tier: str, created: float, index: int) -> QueuedShard:
    return QueuedShard(batch=batch, tier=tier, created_at=created, shard_index=index)


def test_expedited_before_standard_before_flex() -> None:
    queue = [
        shard("ns/flex", "flex", 1, 0),
        shard("ns/std", "standard", 2, 0),
        shard("ns/exp", "expedited", 3, 0),
    ]
    assert [s.batch for s in order_queue(queue)] == ["ns/exp", "ns/std", "ns/flex"]


def test_round_robin_within_a_tier() -> None:
    big = [shard("ns/big", "standard", 1, i) for i in range(5)]
    small = [shard("ns/small", "standard", 2, i) for i in range(2)]
    ordered = [(s.batch, s.shard_index) for s in order_queue(big + small)]
    assert ordered[:4] == [("ns/big", 0), ("ns/small", 0), ("ns/big", 1), ("ns/small", 1)]
    assert ordered[4:] == [("ns/big", 2), ("ns/big", 3), ("ns/big", 4)]


def test_grant_never_overcommits() -> None:
    queue = [shard("ns/a", "standard", 1, i) for i in range(4)]
    assert len(grant_slots(queue, running=1, capacity=3)) == 2
    assert grant_slots(queue, running=3, capacity=3) == []
    assert grant_slots(queue, running=5, capacity=3) == []


BATCH_TIER = {"ns/a": "standard", "ns/b": "expedited", "ns/c": "flex", "ns/d": "standard"}
shards = st.builds(
    lambda batch, created, index: shard(batch, BATCH_TIER[batch], created, index),
    batch=st.sampled_from(sorted(BATCH_TIER)),
    created=st.integers(0, 5).map(float),
    index=st.integers(0, 20),
)


@settings(max_examples=200, deadline=None)
@given(
    queue=st.lists(shards, max_size=40, unique_by=lambda s: (s.batch, s.shard_index)),
    running=st.integers(0, 10),
    capacity=st.integers(0, 10),
)
def test_ordering_invariants(queue: list[QueuedShard], running: int, capacity: int) -> None:
    ordered = order_queue(queue)
    assert sorted(ordered, key=id) == sorted(queue, key=id)  # a permutation
    ranks = [TIER_RANK[s.tier] for s in ordered]
    assert ranks == sorted(ranks)  # tiers never interleave
    for batch in {s.batch for s in queue}:  # a batch's shards keep their index order
        indexes = [s.shard_index for s in ordered if s.batch == batch]
        assert indexes == sorted(indexes)
    granted = grant_slots(queue, running, capacity)
    assert len(granted) == max(0, min(len(queue), capacity - running))
    assert granted == ordered[: len(granted)]
