"""Tenants in the scheduler simulation: a day of standard batches from 50 tenants, one of
them submitting 80 % of the batches, through the real order (``core.scheduling`` with shares,
``core.fairshare`` decay) and autoscaler, beside today's per-batch round-robin on the same trace.

Per tenant it measures the seat-seconds it received to the day's end against what a fluid
weighted fair scheduler (GPS, :class:`FluidReference`) gives it on the same arrivals and the
same seat-seconds — a tenant's fair share of the day is its weight's share of the seats, or
all it asked for when that is less — and the furthest it fell behind that reference at any
minute, in shards. Beside it, the earlier measure: at every tick, the weighted max-min split of
the seats in use among the tenants with work in our own schedule (docs/scheduling.md says why that
one cannot be met without taking seats back). Also the first-grant wait p95 of a light
tenant's first batch (one that arrives while its tenant has no other work), and slot-hours.
Imported by ``scheduler_sim.py``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmbatch.core.autoscaling import ScaleState, damp, raw_desired_slots
from llmbatch.core.fairshare import Usage, tenant_preemptions
from llmbatch.core.scheduling import Guarantee, QueuedShard, Shares, order_queue
from llmbatch.core.slots import RunningShard

TICK = 60.0
DAY = 86400.0
SHARD_REQUESTS = 500
THROUGHPUT = 2.0  # requests per second per seat
DRAIN = {"expedited": 600, "standard": 43200, "flex": 172800}
TENANTS = 50
HEAVY_SHARE = 0.8
#: Weights: tenant t1 has 3, t2 2, the others 1 (the heavy one, t0, included).
WEIGHTS = {"t1": 3.0, "t2": 2.0}
#: Tenants entitled to less than this many seat-seconds are left out of the largest deviation
#: (a handful of shards: one tick of rounding is a large fraction of it).
MIN_ENTITLED = 3600.0
#: The pool's ``maxPreemptionsPerShard`` (its default).
MAX_PREEMPTIONS = 3
#: The guarantee tried with ``preemption: BelowGuarantee``: seats the pool's ``fairSharing``
#: names for every light tenant (the heavy t0 named with none). 1, 2 and 4 seats measured
#: alike (seed 0: largest deviation 26.9, 26.9, 32.5 % against 26.0 % without).
GUARANTEE = 2


@dataclass
class TBatch:
    name: str
    tenant: str
    arrival: float
    requests: int
    shards_left: list[int] = field(default_factory=list)
    running: int = 0
    first_start: float | None = None
    tenant_idle: bool = False
    """Its tenant had no other work (waiting or running) when it arrived: its first batch."""
    resumed: dict[int, float] = field(default_factory=dict)
    """Seconds left of shards taken back mid-run (their committed work is kept)."""
    preempted: Counter[int] = field(default_factory=Counter)


def make_tenant_trace(seed: int, batches_per_hour: float) -> list[TBatch]:
    rng = random.Random(seed + 5000)
    light = [f"t{i}" for i in range(1, TENANTS)]
    out, t, i = [], 0.0, 0
    while True:
        t += rng.expovariate(batches_per_hour / 3600)
        if t >= DAY:
            return out
        tenant = "t0" if rng.random() < HEAVY_SHARE else rng.choice(light)
        size = min(20_000, int(200 * rng.paretovariate(1.2)))
        shards = math.ceil(size / SHARD_REQUESTS)
        out.append(TBatch(f"b{i}", tenant, t, size, list(range(shards))))
        i += 1


def shard_seconds(batch: TBatch, index: int) -> float:
    if index in batch.resumed:
        return batch.resumed.pop(index)
    last = math.ceil(batch.requests / SHARD_REQUESTS) - 1
    requests = batch.requests - SHARD_REQUESTS * last if index == last else SHARD_REQUESTS
    return requests / THROUGHPUT


def water_fill(
    demand: Mapping[str, float], weights: Mapping[str, float], seats: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``seats`` (or seat-seconds) among tenants each wanting
    ``demand``."""
    share: dict[str, float] = {}
    left, open_ = seats, {t for t, d in demand.items() if d > 0}
    while open_ and left > 1e-9:
        total = sum(weights.get(t, 1.0) for t in open_)
        offer = {t: left * weights.get(t, 1.0) / total for t in open_}
        full = {t for t in open_ if demand[t] - share.get(t, 0.0) <= offer[t]}
        if not full:
            for t in open_:
                share[t] = share.get(t, 0.0) + offer[t]
            break
        for t in full:
            give = demand[t] - share.get(t, 0.0)
            share[t] = demand[t]
            left -= give
        open_ -= full
    return share


def _queue(order: str, waiting: list[TBatch], shares: Shares) -> list[tuple[TBatch, QueuedShard]]:
    """The waiting shards in the order's order, with their batches. Ours: each batch under its
    tenant (``<tenant>/<batch>``); per batch: every batch its own tenant (``<batch>/x``)."""
    by_name = {b.name: b for b in waiting}
    if order == "ours":
        queued = order_queue(
            (
                QueuedShard(f"{b.tenant}/{b.name}", "standard", b.arrival, i)
                for b in waiting
                for i in b.shards_left
            ),
            shares,
        )
        return [(by_name[q.batch.split("/")[1]], q) for q in queued]
    queued = order_queue(
        QueuedShard(f"{b.name}/x", "standard", b.arrival, i) for b in waiting for i in b.shards_left
    )
    return [(by_name[q.tenant], q) for q in queued]


@dataclass
class Ledger:
    """Per tenant: seat-seconds received and entitled to (weighted max-min fair split of the
    seats in use among the tenants with work, at each tick)."""

    weights: dict[str, float]
    got: Counter[str] = field(default_factory=Counter)
    entitled: Counter[str] = field(default_factory=Counter)

    def tick(self, active: list[TBatch], runs: list[tuple[float, TBatch]]) -> None:
        seats = Counter(b.tenant for _, b in runs)
        demand = Counter({b.tenant: 0 for b in active})
        for b in active:
            demand[b.tenant] += len(b.shards_left) + b.running
        weights = {t: self.weights.get(t, 1.0) for t in demand}
        for tenant, share in water_fill(dict(demand), weights, sum(seats.values())).items():
            self.entitled[tenant] += share * TICK
        for tenant, n in seats.items():
            self.got[tenant] += n * TICK


class FluidReference:
    """The ideal weighted fair scheduler on the same arrivals and the same seat-seconds: GPS
    (generalised processor sharing, the reference of fair queueing), fed every tick the
    seat-seconds our order ran, split among the tenants with work by weighted max-min, with
    each tenant's own shards the limit of what it can use (a shard runs on one seat at a time,
    so a tenant's tick is worth at most ``min(left, TICK)`` per unfinished shard).

    It keeps its own state, unlike the per-tick split of :class:`Ledger` (the split of the seats
    in use among the tenants that have work *in our schedule*): there a tenant our order made
    wait longer is entitled to more for every minute it waited, so a batch's wait counts twice
    — as a shortfall now and as entitlement it can never use. In the reference a tenant's work
    is what it submitted, whenever it is served; the comparison is of service by a time."""

    def __init__(self, weights: dict[str, float]) -> None:
        self.weights = weights
        self.left: dict[str, list[float]] = {}
        """Per tenant, its shards' seconds of work left, in arrival order."""
        self.served: defaultdict[str, float] = defaultdict(float)

    def arrive(self, batch: TBatch) -> None:
        full = batch.requests / THROUGHPUT
        shards = len(batch.shards_left)
        per = SHARD_REQUESTS / THROUGHPUT
        work = [per] * (shards - 1) + [full - per * (shards - 1)]
        self.left.setdefault(batch.tenant, []).extend(work)

    def tick(self, seat_seconds: float) -> None:
        cap = {t: sum(min(w, TICK) for w in left) for t, left in self.left.items() if left}
        weights = {t: self.weights.get(t, 1.0) for t in cap}
        for tenant, give in water_fill(cap, weights, seat_seconds).items():
            self.served[tenant] += give
            left = self.left[tenant]
            for i, w in enumerate(left):
                took = min(w, TICK, give)
                left[i] -= took
                give -= took
                if give <= 1e-9:
                    break
            self.left[tenant] = [w for w in left if w > 1e-9]


@dataclass
class Lag:
    """Per tenant, the furthest our service fell behind the reference's, and ran ahead of it,
    at any tick of the day (seat-seconds; fair queueing bounds the first by about one shard)."""

    behind: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    ahead: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def tick(self, reference: Mapping[str, float], ours: Mapping[str, float]) -> None:
        for tenant, ref in reference.items():
            gap = ref - ours.get(tenant, 0.0)
            self.behind[tenant] = max(self.behind[tenant], gap)
            self.ahead[tenant] = max(self.ahead[tenant], -gap)


Run = tuple[float, TBatch, int]
"""(end, batch, shard index) of a shard on a seat."""


def _start(batch: TBatch, index: int, now: float, runs: list[Run]) -> None:
    batch.shards_left.remove(index)
    batch.running += 1
    if batch.first_start is None:
        batch.first_start = now
    runs.append((now + shard_seconds(batch, index), batch, index))


def _preempt(
    order: str, waiting: list[TBatch], runs: list[Run], shares: Shares, seats: int, now: float
) -> int:
    """Take running shards back for waiting shards of tenants below their guarantee, by the
    operator's rule (``core.fairshare.tenant_preemptions``): the victim stops feeding, commits
    and goes back to the queue with what it has left (its seat frees within the tick: a drain
    takes seconds, a tick is a minute). The seats freed."""
    queue = [q for _, q in _queue(order, waiting, shares)]
    running = [
        RunningShard(
            QueuedShard(f"{b.tenant}/{b.name}", "standard", b.arrival, i),
            f"{b.name}-{i}",
            b.preempted[i],
        )
        for _, b, i in runs
    ]
    moves = tenant_preemptions(queue, running, shares, seats, MAX_PREEMPTIONS)
    taken = {victim.key for victim, _ in moves}
    for end, batch, index in [r for r in runs if f"{r[1].name}-{r[2]}" in taken]:
        runs.remove((end, batch, index))
        batch.running -= 1
        batch.shards_left.append(index)
        batch.resumed[index] = end - now
        batch.preempted[index] += 1
    return len(moves)


def simulate_tenants(
    trace: list[TBatch],
    max_slots: int,
    order: str,
    half_life: float = 3600.0,
    weights_of: dict[str, float] | None = None,
    until: float | None = None,
    guarantee: int = 0,
) -> dict[str, object]:
    """``order``: "ours" (shares by tenant, usage decayed over ``half_life``) or "batches"
    (today's round-robin across batches: every batch its own tenant). ``guarantee``: seats the
    pool guarantees every tenant but the heavy t0, with ``preemption: BelowGuarantee``."""
    ledger = Ledger(WEIGHTS if weights_of is None else weights_of)
    reference = FluidReference(ledger.weights)
    # seat-seconds our order ran per tenant, to the day's end
    served: defaultdict[str, float] = defaultdict(float)
    lag = Lag()
    batches = [TBatch(b.name, b.tenant, b.arrival, b.requests, list(b.shards_left)) for b in trace]
    pending = sorted(batches, key=lambda b: b.arrival)
    active: list[TBatch] = []
    runs: list[Run] = []
    state = ScaleState(desired=0)
    usage = Usage(half_life, 0.0)
    provisioned = now = 0.0
    while (now < DAY or any(b.shards_left or b.running for b in active) or pending) and (
        until is None or now < until
    ):
        while pending and pending[0].arrival <= now:
            batch = pending.pop(0)
            batch.tenant_idle = all(b.tenant != batch.tenant for b in active)
            active.append(batch)
            reference.arrive(batch)
        for _, batch, _ in (r for r in runs if r[0] <= now):
            batch.running -= 1
        runs = [r for r in runs if r[0] > now]
        active = [b for b in active if b.shards_left or b.running]
        backlog = dict.fromkeys(DRAIN, 0)
        backlog["standard"] = sum((len(b.shards_left) + b.running) * SHARD_REQUESTS for b in active)
        state = damp(state, raw_desired_slots(backlog, THROUGHPUT, DRAIN, 0, max_slots), now, 600)
        held = Counter(b.tenant for _, b, _ in runs)
        usage = usage.advance(held, now)
        tenants = {b.tenant for b in active}
        weights = {t: ledger.weights.get(t, 1.0) for t in tenants}
        guarantees = {t: Guarantee(min_seats=guarantee) for t in tenants if t != "t0"}
        shares = Shares(seats=held, weights=weights, usage=usage.seats(), guarantees=guarantees)
        waiting = [b for b in active if b.shards_left]
        for batch, q in _queue(order, waiting, shares)[: max(0, state.desired - len(runs))]:
            _start(batch, q.shard_index, now, runs)
        waiting = [b for b in active if b.shards_left]
        if guarantee and waiting:
            held = Counter(b.tenant for _, b, _ in runs)
            shares = Shares(seats=held, weights=weights, usage=shares.usage, guarantees=guarantees)
            freed = _preempt(order, waiting, runs, shares, state.desired, now)
            held = Counter(b.tenant for _, b, _ in runs)
            shares = Shares(seats=held, weights=weights, usage=shares.usage, guarantees=guarantees)
            waiting = [b for b in active if b.shards_left]
            for batch, q in _queue(order, waiting, shares)[:freed]:
                _start(batch, q.shard_index, now, runs)
        ledger.tick(active, [(end, b) for end, b, _ in runs])
        if now < DAY:
            ran: defaultdict[str, float] = defaultdict(float)
            for end, b, _ in runs:
                ran[b.tenant] += min(end - now, TICK)
            for tenant, seconds in ran.items():
                served[tenant] += seconds
            reference.tick(sum(ran.values()))
            lag.tick(reference.served, served)
        provisioned += max(state.desired, len(runs)) * TICK
        now += TICK
    light_waits = sorted(
        b.first_start - b.arrival
        for b in batches
        if b.tenant != "t0" and b.tenant_idle and b.first_start is not None
    )
    return {
        "got": ledger.got,
        "entitled": ledger.entitled,
        "served": served,
        "reference": reference.served,
        "lag": lag,
        "light_wait_p95": light_waits[min(len(light_waits) - 1, int(0.95 * len(light_waits)))],
        "slot_hours": provisioned / 3600,
    }


def backlogged_shares(max_slots: int, half_life: float) -> dict[str, float]:
    """Three tenants with weights 1:1:2 and backlogs that last the whole day: each one's share
    of the day's seat-seconds."""
    trace = [
        TBatch(f"{t}{i}", t, i, 40 * SHARD_REQUESTS, list(range(40)))
        for t in ("x", "y", "z")
        for i in range(80)
    ]
    got: Counter[str] = simulate_tenants(  # type: ignore[assignment]
        trace, max_slots, "ours", half_life, {"z": 2.0}, until=DAY
    )["got"]
    total = sum(got.values())
    return {t: got[t] / total for t in ("x", "y", "z")}


def deviations(result: dict[str, object]) -> tuple[float, float, float]:
    """(the largest got/entitled - 1 above 0 and the lowest below it, among tenants entitled to
    MIN_ENTITLED or more — served more than the split, and less —, and the total variation
    Σ|got - entitled| / 2Σ entitled)."""
    got: Counter[str] = result["got"]  # type: ignore[assignment]
    entitled: Counter[str] = result["entitled"]  # type: ignore[assignment]
    tenants = set(got) | set(entitled)
    big = [got[t] / entitled[t] - 1 for t in tenants if entitled[t] >= MIN_ENTITLED]
    variation = sum(abs(got[t] - entitled[t]) for t in tenants) / (2 * sum(entitled.values()))
    return max([0.0, *big]), min([0.0, *big]), variation


def against_reference(result: dict[str, object]) -> tuple[float, float, float, float]:
    """Our service to the day's end against the fluid reference's (:class:`FluidReference`):
    (the largest served/reference - 1 above 0 and the lowest below it, among tenants the
    reference serves MIN_ENTITLED or more; the furthest any light tenant and the heavy t0 fell
    behind the reference at any tick, in shards)."""
    served: dict[str, float] = result["served"]  # type: ignore[assignment]
    reference: dict[str, float] = result["reference"]  # type: ignore[assignment]
    lag: Lag = result["lag"]  # type: ignore[assignment]
    big = [served[t] / reference[t] - 1 for t in reference if reference[t] >= MIN_ENTITLED]
    shard = SHARD_REQUESTS / THROUGHPUT
    light = max((v for t, v in lag.behind.items() if t != "t0"), default=0.0)
    return max([0.0, *big]), min([0.0, *big]), light / shard, lag.behind["t0"] / shard


def tenant_report(seeds: int, max_slots: int, batches_per_hour: float) -> None:
    shard_minutes = SHARD_REQUESTS / THROUGHPUT / 60
    print(
        f"\ntenants: {TENANTS} tenants, t0 submits {HEAVY_SHARE:.0%} of ~{batches_per_hour:.0f} "
        f"standard batches/h for a day (weights t1=3, t2=2, others 1), {max_slots} max slots, "
        f"shard = {shard_minutes:.1f} min, median of {seeds} seeds"
    )
    rows: dict[str, list[tuple[float, ...]]] = {}
    kept = f"{GUARANTEE} seats kept"
    for seed in range(seeds):
        trace = make_tenant_trace(seed, batches_per_hour)
        for label, order, half_life, guarantee in (
            ("ours (half-life 1 h)", "ours", 3600.0, 0),
            ("ours (half-life 0)", "ours", 0.0, 0),
            (f"ours (1 h, {kept})", "ours", 3600.0, GUARANTEE),
            (f"ours (0, {kept})", "ours", 0.0, GUARANTEE),
            ("per-batch round-robin", "batches", 0.0, 0),
        ):
            result = simulate_tenants(trace, max_slots, order, half_life, guarantee=guarantee)
            wait = float(result["light_wait_p95"])  # type: ignore[arg-type]
            hours = float(result["slot_hours"])  # type: ignore[arg-type]
            row = (*against_reference(result), wait / 60, hours, *deviations(result))
            rows.setdefault(label, []).append(row)
    print(
        f"{'order':26} {'day: over':>9} {'under':>7} {'lag light':>9} {'lag t0':>7} "
        f"{'light p95 min':>14} {'slot-h':>8}   per-minute split: {'over':>7} {'under':>7} "
        f"{'tot var':>7}"
    )
    base = statistics.median(r[5] for r in rows["per-batch round-robin"])
    for label, values in rows.items():
        over, under, lag_light, lag_t0, wait, hours, t_over, t_under, variation = (
            statistics.median(v[i] for v in values) for i in range(9)
        )
        print(
            f"{label:26} {over:+9.1%} {under:+7.1%} {lag_light:9.1f} {lag_t0:7.1f} "
            f"{wait:14.1f} {hours:8.1f}   {'':17} {t_over:+7.1%} {t_under:+7.1%} "
            f"{variation:7.1%}  (slot-h {hours / base - 1:+.1%})"
        )
    for half_life in (3600.0, 0.0):
        shares = backlogged_shares(max_slots, half_life)
        print(
            f"3 tenants 1:1:2, backlogged all day, half-life {half_life:.0f} s: shares "
            + ", ".join(f"{t} {v:.1%}" for t, v in shares.items())
            + " (weights: 25 %, 25 %, 50 %)"
        )
    print(
        f"targets: day over and under within ±5 %, light p95 <= {shard_minutes:.1f} min, "
        "slot-hours within 2 %. 'day': each tenant's seat time to the day's end against the "
        "fluid weighted fair reference (GPS) on the same arrivals and seat-seconds, among tenants "
        f"it serves >= {MIN_ENTITLED / 3600:.0f} seat-hour; 'lag': the furthest a light tenant "
        "and the heavy t0 fell behind that reference at any minute, in shards; 'per-minute "
        "split': against the weighted max-min split of the seats in use among the tenants with "
        f"work in our own schedule, every minute (docs/scheduling.md); '{kept}': preemption "
        f"BelowGuarantee, {GUARANTEE} seats guaranteed to each light tenant"
    )
