"""Fair shares across tenants within a tier (#33): the tenant furthest below its weighted share
of the pool's seats goes next; tiers still come first; one tenant's order is as before."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.core.scheduling import (
    WEIGHT_ANNOTATION,
    QueuedShard,
    Shares,
    order_queue,
    tenant_weight,
)
from llmbatch.core.tiers import TIER_RANK


def shard(batch: str, created: float, index: int = 0, tier: str = "standard") -> QueuedShard:
    return QueuedShard(batch=batch, tier=tier, created_at=created, shard_index=index)


def test_a_light_tenants_batch_goes_ahead_of_a_heavy_tenants_backlog() -> None:
    """Tenant A queued 40 batches and holds both seats; B's one batch, created last, is next."""
    backlog = [shard(f"a/b{i}", created=i) for i in range(40)]
    late = shard("b/only", created=100)
    ordered = order_queue([*backlog, late], Shares(seats={"a": 2}))
    assert ordered[0] == late
    # with nothing held either, B is served within the first two
    assert late in order_queue([*backlog, late])[:2]


def test_weights_divide_a_continuous_backlog() -> None:
    queue = [shard(f"{t}/b{i}", created=i) for t in ("x", "y", "z") for i in range(100)]
    head = order_queue(queue, Shares(weights={"z": 2.0}))[:40]
    assert Counter(s.tenant for s in head) == {"x": 10, "y": 10, "z": 20}


def test_seats_held_count_against_a_tenants_share() -> None:
    queue = [shard(f"{t}/b{i}", created=i) for t in ("x", "y") for i in range(10)]
    head = order_queue(queue, Shares(seats={"x": 4}))[:6]
    # y catches up to x's four seats first, then they alternate
    assert [s.tenant for s in head[:4]] == ["y"] * 4
    assert Counter(s.tenant for s in head) == {"x": 1, "y": 5}


def test_tiers_come_before_shares() -> None:
    heavy_expedited = shard("a/exp", created=5, tier="expedited")
    light_standard = shard("b/std", created=1)
    ordered = order_queue([light_standard, heavy_expedited], Shares(seats={"a": 50}))
    assert ordered == [heavy_expedited, light_standard]


def test_one_tenant_keeps_round_robin_across_its_batches() -> None:
    big = [shard("ns/big", 1, i) for i in range(5)]
    small = [shard("ns/small", 2, i) for i in range(2)]
    ordered = [(s.batch, s.shard_index) for s in order_queue(big + small)]
    assert ordered[:4] == [("ns/big", 0), ("ns/small", 0), ("ns/big", 1), ("ns/small", 1)]


def test_weight_annotation() -> None:
    assert tenant_weight(None) == 1.0
    assert tenant_weight({WEIGHT_ANNOTATION: "3"}) == 3.0
    assert tenant_weight({WEIGHT_ANNOTATION: "heavy"}) == 1.0
    assert tenant_weight({WEIGHT_ANNOTATION: "nan"}) == 1.0
    assert tenant_weight({WEIGHT_ANNOTATION: "0"}) == 0.01  # never starved
    assert tenant_weight({WEIGHT_ANNOTATION: "1e9"}) == 1000.0


TENANTS = ["t1", "t2", "t3", "t4"]
queues = st.lists(
    st.tuples(
        st.sampled_from(TENANTS),
        st.integers(0, 5),  # batch
        st.integers(0, 3),  # shard index
        st.sampled_from(["expedited", "standard", "flex"]),
        st.integers(0, 50),  # created
    ),
    max_size=60,
    unique_by=lambda row: (row[0], row[1], row[2]),
)


@settings(max_examples=300, deadline=None)
@given(
    rows=queues,
    held=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 6)),
    weights=st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1, 3])),
)
def test_no_tenant_with_work_waits_while_one_above_its_share_takes_a_seat(
    rows: list[tuple[str, int, int, str, int]],
    held: dict[str, int],
    weights: dict[str, float],
) -> None:
    """Replaying the order seat by seat: each seat goes to a tenant of the best waiting tier
    whose share after it is the least among that tier's waiting tenants; nothing is lost."""
    batch_tier = {}
    waiting = []
    for tenant, batch, index, tier, created in rows:
        name = f"{tenant}/b{batch}"
        tier = batch_tier.setdefault(name, tier)  # a batch has one tier
        waiting.append(shard(name, created, index, tier))
    shares = Shares(seats=held, weights=weights)
    ordered = order_queue(waiting, shares)
    assert sorted(ordered, key=repr) == sorted(waiting, key=repr)
    seats = Counter(held)
    left = list(waiting)
    for granted in ordered:
        best_tier = min(TIER_RANK[s.tier] for s in left)
        rivals = {s.tenant for s in left if TIER_RANK[s.tier] == best_tier}
        assert TIER_RANK[granted.tier] == best_tier

        def share(tenant: str) -> float:
            return (seats[tenant] + 1) / shares.weight(tenant)

        assert share(granted.tenant) == min(share(t) for t in rivals)
        seats[granted.tenant] += 1
        left.remove(granted)


def test_the_pool_round_counts_each_tenants_seats_and_reads_weights_from_the_watch() -> None:
    from llmbatch.controller.namespaces import NamespaceCache
    from llmbatch.controller.slotstate import Work, pool_shares

    cache = NamespaceCache()
    cache.notice({"metadata": {"name": "a", "annotations": {WEIGHT_ANNOTATION: "3"}}})
    cache.notice({"metadata": {"name": "b"}})
    cache.notice({"metadata": {"name": "gone"}})
    cache.notice({"metadata": {"name": "gone"}}, deleted=True)
    assert cache.annotations("gone") is None
    assert cache.annotations("b") == {}

    def work(batch: str, index: int) -> Work:
        queued = shard(batch, 0, index)
        return Work(queued=queued, key=f"{batch}/{index}", spec_key="", lease_key="", since=0)

    items = {w.key: w for w in [work("a/x", 0), work("a/x", 1), work("b/y", 0), work("c/z", 0)]}
    shares = pool_shares(items, {"a/x/0", "a/x/1", "b/y/0", "ended/0"}, cache.weight)
    assert shares.seats == {"a": 2, "b": 1}
    assert shares.weights == {"a": 3.0, "b": 1.0, "c": 1.0}
