"""Fair sharing's second part (#33): remembered use with a decay, guarantees (minimum and
maximum seats per named tenant) and preemption across tenants that cannot flap."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.api.resources.pool import FairSharing, TenantShareSettings
from llmbatch.controller.fairstate import STATUS_TENANTS, TenantLedger, tenant_status
from llmbatch.controller.slotstate import Work, pool_shares
from llmbatch.core.fairshare import (
    MAX_REMEMBERED,
    Usage,
    fair_seats,
    may_lose,
    may_receive,
    tenant_preemptions,
)
from llmbatch.core.scheduling import Guarantee, QueuedShard, Shares, order_queue, split_queue
from llmbatch.core.slots import RunningShard, SlotView, place
from llmbatch.core.tiers import TIER_RANK

HOUR = 3600.0


def shard(batch: str, created: float, index: int = 0, tier: str = "standard") -> QueuedShard:
    return QueuedShard(batch=batch, tier=tier, created_at=created, shard_index=index, model="m")


def backlog(tenant: str, batches: int, created: float = 0) -> list[QueuedShard]:
    return [shard(f"{tenant}/b{i}", created + i) for i in range(batches)]


# --- remembered use -------------------------------------------------------------------------


def test_use_decays_with_the_half_life_and_tends_to_the_seats_held() -> None:
    start = Usage(HOUR, 0.0)
    one = start.advance({"a": 2}, HOUR)
    # from nothing, one half-life holding 2 seats: half-way to the 2 seats of steady use
    assert one.seats()["a"] == pytest.approx(1.0)
    assert start.advance({"a": 2}, 20 * HOUR).seats()["a"] == pytest.approx(2.0, rel=1e-5)
    # idle for a half-life: half of it is left
    assert one.advance({}, 2 * HOUR).seats()["a"] == pytest.approx(0.5)


def test_advancing_in_steps_is_the_same_as_at_once() -> None:
    at_once = Usage(600.0, 0.0, {"a": 100.0}).advance({"a": 3, "b": 1}, 900)
    stepped = Usage(600.0, 0.0, {"a": 100.0})
    for now in (100, 250, 600, 900):
        stepped = stepped.advance({"a": 3, "b": 1}, now)
    assert stepped.seat_seconds == pytest.approx(at_once.seat_seconds)


def test_no_half_life_remembers_nothing() -> None:
    assert Usage(0.0, 0.0).advance({"a": 5}, HOUR).seats() == {}


def test_memory_is_bounded_and_forgets_faded_use() -> None:
    many = {f"t{i}": 1 for i in range(MAX_REMEMBERED + 50)}
    assert len(Usage(HOUR, 0.0).advance(many, 60).seat_seconds) == MAX_REMEMBERED
    faded = Usage(60.0, 0.0, {"old": 60.0 / math.log(2)})  # 1 seat of recent use
    assert faded.advance({}, 60 * 10).seat_seconds == {}  # 1/1024 of a seat: forgotten


def test_a_tenant_that_used_the_pool_a_moment_ago_yields_to_one_that_did_not() -> None:
    """Both hold nothing now and have work; a used four seats until a minute ago."""
    ledger = TenantLedger()
    ledger.advance("p", HOUR, Counter({"a": 4}), 0)
    ledger.advance("p", HOUR, Counter(), 2 * HOUR)  # a held 4 seats for two hours
    usage = ledger.advance("p", HOUR, Counter(), 2 * HOUR + 60)
    queue = backlog("a", 10) + backlog("b", 10, created=100)
    head = order_queue(queue, Shares(usage=usage.seats()))
    assert [s.tenant for s in head[:3]] == ["b"] * 3
    # without memory (half-life 0) they alternate, a's older batch first
    assert [s.tenant for s in order_queue(queue)[:2]] == ["a", "b"]


def test_a_restarted_operator_resumes_the_use_from_the_pool_status() -> None:
    ledger = TenantLedger()
    ledger.advance("p", HOUR, Counter({"a": 2}), 0)
    usage = ledger.advance("p", HOUR, Counter({"a": 2}), HOUR)
    status = {"fairSharing": tenant_status(Shares(weights={"a": 1.0}), usage, [], 4)}
    restarted = TenantLedger()
    restarted.resume("p", status, HOUR)
    resumed = restarted.advance("p", HOUR, Counter(), 2 * HOUR)  # down for an hour
    assert resumed.seats()["a"] == pytest.approx(0.5, rel=1e-3)
    restarted.resume("p", {"fairSharing": {"usageAt": 0, "tenants": []}}, HOUR)  # kept: ignored
    assert restarted.advance("p", HOUR, Counter(), 2 * HOUR).seats()["a"] > 0


def test_the_status_lists_the_busiest_tenants_only() -> None:
    weights = {f"t{i:02d}": 1.0 for i in range(30)}
    seats = {f"t{i:02d}": i % 4 for i in range(30)}
    fair = tenant_status(Shares(seats=seats, weights=weights), Usage(HOUR, 5.0), [], 60)
    assert fair["activeTenants"] == 30
    assert len(fair["tenants"]) == STATUS_TENANTS
    assert Counter(t["seats"] for t in fair["tenants"]) == {3: 7, 2: 7, 1: 6}
    assert fair["tenants"][0]["share"] == "2.00"


# --- guarantees -----------------------------------------------------------------------------


def test_a_tenant_below_its_minimum_is_served_first() -> None:
    queue = [q for t in ("a", "b", "c") for q in backlog(t, 5)] + backlog("g", 5, created=50)
    shares = Shares(seats={"g": 1}, guarantees={"g": Guarantee(min_seats=3)})
    head = order_queue(queue, shares)
    assert [s.tenant for s in head[:2]] == ["g", "g"]
    assert "g" not in {s.tenant for s in head[2:5]}  # then it is one tenant among four


def test_a_tenants_maximum_is_a_hard_cap_and_the_rest_is_work_conserving() -> None:
    queue = backlog("a", 6) + backlog("b", 1)
    shares = Shares(seats={"a": 1}, guarantees={"a": Guarantee(max_seats=3)})
    ordered, capped = split_queue(queue, shares)
    assert Counter(s.tenant for s in ordered) == {"a": 2, "b": 1}
    assert len(capped) == 4
    assert {s.tenant for s in capped} == {"a"}
    # eight free seats: a still gets two, the capped ones neither run nor queue on a slot
    slots = [SlotView(name="s", load=1, capacity=9, ready=True, model="m", queue=8)]
    placement = place(queue, slots, desired=1, capacity=9, shares=shares)
    assert Counter(q.tenant for q, _ in placement.assign) == {"a": 2, "b": 1}
    assert placement.capped == capped
    assert not placement.waiting


def test_the_pool_names_tenants_weights_and_guarantees() -> None:
    settings_ = FairSharing(
        tenants=[
            TenantShareSettings(namespace="a", min_seats=2, max_seats=4, weight="3"),
            TenantShareSettings(namespace="b", weight="5000"),
        ]
    )

    def work(batch: str) -> Work:
        return Work(queued=shard(batch, 0), key=batch, spec_key="", lease_key="", since=0)

    items = {w.key: w for w in (work("a/x"), work("b/y"), work("c/z"))}
    shares = pool_shares(items, {"a/x"}, lambda t: 2.0, settings_, {"a": 1.5})
    assert shares.weights == {"a": 3.0, "b": 1000.0, "c": 2.0}
    assert shares.guarantee("a") == Guarantee(2, 4)
    assert shares.guarantee("c") == Guarantee()
    assert shares.usage == {"a": 1.5}


TENANTS = ["t1", "t2", "t3", "t4", "t5"]


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(TENANTS),
            st.integers(0, 4),
            st.integers(0, 3),
            st.sampled_from(["standard", "flex"]),
        ),
        max_size=50,
        unique_by=lambda row: (row[0], row[1], row[2]),
    ),
    held=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 5)),
    usage=st.dictionaries(st.sampled_from(TENANTS), st.floats(0, 6)),
    limits=st.dictionaries(
        st.sampled_from(TENANTS), st.tuples(st.integers(0, 4), st.none() | st.integers(0, 8))
    ),
)
def test_guarantees_order_property(
    rows: list[tuple[str, int, int, str]],
    held: dict[str, int],
    usage: dict[str, float],
    limits: dict[str, tuple[int, int | None]],
) -> None:
    """Seat by seat: a tenant below its minimum is never passed over for one at or above its
    own in the same tier; no tenant passes its maximum; nothing is lost; and among tenants on
    the same side of their minimum the seat goes to the least loaded (seats + recent use)."""
    tier_of = {}
    waiting = []
    for tenant, batch, index, tier in rows:
        name = f"{tenant}/b{batch}"
        waiting.append(shard(name, batch, index, tier_of.setdefault(name, tier)))
    guarantees = {
        t: Guarantee(lo, None if hi is None else max(lo, hi)) for t, (lo, hi) in limits.items()
    }
    shares = Shares(seats=held, usage=usage, guarantees=guarantees)
    ordered, capped = split_queue(waiting, shares)
    assert sorted(ordered + capped, key=repr) == sorted(waiting, key=repr)
    seats = Counter(held)
    left = [s for s in waiting if s not in capped]
    for granted in ordered:
        cap = shares.guarantee(granted.tenant).max_seats
        assert cap is None or seats[granted.tenant] < cap
        rank = min(TIER_RANK[s.tier] for s in left)
        assert TIER_RANK[granted.tier] == rank
        rivals = {s.tenant for s in left if TIER_RANK[s.tier] == rank}

        def key(tenant: str) -> tuple[bool, float]:
            below = seats[tenant] < shares.guarantee(tenant).min_seats
            return (not below, seats[tenant] + usage.get(tenant, 0.0) + 1)

        assert key(granted.tenant) == min(key(t) for t in rivals)
        seats[granted.tenant] += 1
        left.remove(granted)
    for tenant in {s.tenant for s in capped}:
        assert seats[tenant] >= (shares.guarantee(tenant).max_seats or 0)


# --- preemption across tenants --------------------------------------------------------------


def running(tenant: str, count: int, tier: str = "standard", start: int = 0) -> list[RunningShard]:
    return [
        RunningShard(shard(f"{tenant}/r{i}", i, tier=tier), f"{tenant}-r{i}", preemptions=0)
        for i in range(start, start + count)
    ]


def test_a_tenant_below_its_guarantee_takes_seats_from_one_above_its_share() -> None:
    waiting = backlog("b", 3, created=100)
    shares = Shares(weights={"a": 1.0, "b": 1.0}, guarantees={"b": Guarantee(min_seats=3)})
    moves = tenant_preemptions(waiting, running("a", 4), shares, total_seats=4, max_per_shard=3)
    # b's share is 2 of the 4 seats: it takes two (not its three guaranteed), a keeps its two
    assert [(v.shard.tenant, r.tenant) for v, r in moves] == [("a", "b"), ("a", "b")]
    assert {v.key for v, _ in moves} == {"a-r3", "a-r2"}  # the newest batches


def test_no_preemption_from_a_tenant_at_its_share_of_a_better_tier_or_another_model() -> None:
    shares = Shares(weights={"a": 1.0, "b": 1.0}, guarantees={"b": Guarantee(min_seats=2)})
    waiting = backlog("b", 2)
    assert not tenant_preemptions(waiting, running("a", 2) + running("b", 0), shares, 4, 3)
    assert not tenant_preemptions(waiting, running("a", 4, tier="expedited"), shares, 4, 3)
    other = [QueuedShard(batch="b/x", tier="standard", created_at=0, shard_index=0, model="n")]
    assert not tenant_preemptions(other, running("a", 4), shares, 4, 3)
    worn = [RunningShard(r.shard, r.key, preemptions=3) for r in running("a", 4)]
    assert not tenant_preemptions(waiting, worn, shares, 4, 3)
    no_guarantee = Shares(weights={"a": 1.0, "b": 1.0})
    assert not tenant_preemptions(waiting, running("a", 4), no_guarantee, 4, 3)


def test_a_receiver_takes_no_more_than_its_share_even_below_its_guarantee() -> None:
    """Three tenants, six seats (two each): b's guarantee of five is reclaimed up to its share;
    beyond that it waits like everyone (c, with work and no seat, is not passed over)."""
    shares = Shares(
        weights={"a": 1.0, "b": 1.0, "c": 1.0}, guarantees={"b": Guarantee(min_seats=5)}
    )
    moves = tenant_preemptions(backlog("b", 5) + backlog("c", 2), running("a", 6), shares, 6, 3)
    assert [r.tenant for _, r in moves] == ["b", "b"]


def test_a_victim_keeps_its_own_guarantee() -> None:
    shares = Shares(
        weights={"a": 1.0, "b": 1.0, "c": 1.0},
        guarantees={"a": Guarantee(min_seats=5), "b": Guarantee(min_seats=2)},
    )
    # a holds 5 (its guarantee) of 6 seats, c holds 1: b's share is 2 but nobody may lose
    assert not tenant_preemptions(backlog("b", 2), running("a", 5) + running("c", 1), shares, 6, 3)


@settings(max_examples=300, deadline=None)
@given(
    held=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 8), min_size=1),
    weights=st.dictionaries(st.sampled_from(TENANTS), st.sampled_from([0.5, 1.0, 2.0, 3.0])),
    minimums=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 8)),
    demand=st.dictionaries(st.sampled_from(TENANTS), st.integers(0, 8)),
    spare=st.integers(0, 3),
)
def test_preemption_across_tenants_cannot_flap(
    held: dict[str, int],
    weights: dict[str, float],
    minimums: dict[str, int],
    demand: dict[str, int],
    spare: int,
) -> None:
    """Rounds of preemption, each victim's seat going to its receiver, until none is left: no
    tenant both loses and gains a seat (no A→B→A), every move keeps the rule, and the moves
    stop within the pool's total excess over fair share."""
    tenants = set(held) | set(demand)
    weight = {t: weights.get(t, 1.0) for t in tenants}
    total = sum(held.values()) + spare
    shares = Shares(
        weights=weight, guarantees={t: Guarantee(min_seats=m) for t, m in minimums.items()}
    )
    share = fair_seats(weight, total)
    seats = Counter(held)
    excess = sum(max(0.0, seats[t] - share[t]) for t in tenants)
    lost: set[str] = set()
    gained: set[str] = set()
    moves_made = 0
    serial = 0
    for _round in range(100):
        runs = [r for t, n in seats.items() for r in running(t, n, start=serial)]
        serial += 100
        waiting = [q for t, n in demand.items() for q in backlog(t, n)]
        moves = tenant_preemptions(waiting, runs, shares, total, max_per_shard=1000)
        if not moves:
            break
        for victim, receiver in moves:
            v, r = victim.shard.tenant, receiver.tenant
            minimum = shares.guarantee
            assert may_lose(seats[v], minimum(v).min_seats, share[v])
            assert may_receive(seats[r], minimum(r).min_seats, share[r])
            seats[v] -= 1
            seats[r] += 1
            lost.add(v)
            gained.add(r)
            moves_made += 1
    else:
        raise AssertionError("preemption did not settle")
    assert not lost & gained
    assert moves_made <= excess + 1e-9


# --- seen from outside ----------------------------------------------------------------------


def test_per_tenant_series_only_when_the_platform_opts_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmbatch.controller import metrics
    from llmbatch.controller.config import OperatorConfig

    monkeypatch.setenv("LLMBATCH_STORE_URI", "file:///tmp/x")
    assert OperatorConfig.from_env().tenant_metrics is False
    monkeypatch.setenv("LLMBATCH_METRICS_TENANT_LABELS", "true")
    assert OperatorConfig.from_env().tenant_metrics is True

    def value(name: str, **labels: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(name, labels)

    shares = Shares(seats={"a": 3, "b": 1}, weights={"a": 1.0, "b": 1.0})
    fair = tenant_status(shares, Usage(HOUR, 0.0), [], 4)
    metrics.observe_tenants("fair-pool", fair, per_tenant=False)
    assert value("llmbatch_pool_tenants_active", pool="fair-pool") == 2
    assert value("llmbatch_pool_tenant_share_ratio_max", pool="fair-pool") == 1.5
    assert value("llmbatch_pool_tenant_seats", pool="fair-pool", tenant="a") is None
    metrics.observe_tenants("fair-pool", fair, per_tenant=True)
    assert value("llmbatch_pool_tenant_seats", pool="fair-pool", tenant="a") == 3
    assert value("llmbatch_pool_tenant_fair_share_seats", pool="fair-pool", tenant="b") == 2
    only_b = tenant_status(Shares(seats={"b": 2}, weights={"b": 1.0}), Usage(0.0, 0.0), [], 4)
    metrics.observe_tenants("fair-pool", only_b, per_tenant=True)
    assert value("llmbatch_pool_tenant_seats", pool="fair-pool", tenant="a") is None
    metrics.forget_pool("fair-pool")
    assert value("llmbatch_pool_tenant_seats", pool="fair-pool", tenant="b") is None
    assert value("llmbatch_pool_tenants_active", pool="fair-pool") is None
