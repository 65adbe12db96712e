#!/usr/bin/env python3
"""Replay a day of synthetic batch traffic through the real scheduler and autoscaler.

Side by side on the same trace: ours (``core.scheduling`` order + ``core.autoscaling`` desired
slots with scale-down damping) against a FIFO baseline holding the pool's maximum slots all the
time. Simulated time, one-minute ticks; arrivals over 24 h (a busy morning peak), then the queue
drains. Prints, for several seeds (median):

  expedited time-to-first-slot p50/p95, standard completion within 24 h (%), flex completion
  within 72 h (%), slot busy fraction while work is waiting, and slot-hours provisioned.

Then, for a day where most batches are small, the cost of engine starts: cold slots (every shard
starts an engine, today's executor) against warm slots (a slot loads once and runs shard after
shard until idle) for an 8B-class pool (45 s to load) and a 70B-class one (180 s): engine
starts, GPU-hours loading / inferring / idle, expedited wait p95 and small-batch completion.

Then tenants (#33, ``benchmarks/tenant_sim.py``): 50 tenants, one submitting 80 % of the
batches, through our order (shares by tenant, usage decayed) beside today's per-batch
round-robin: each tenant's seat time against its weighted fair split, a light tenant's
first-grant wait p95 and slot-hours.

    .venv/bin/python benchmarks/scheduler_sim.py [--seeds 5] [--max-slots 16] [--tenant-rate 120]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from dataclasses import dataclass, field

from llmbatch.core.autoscaling import ScaleState, damp, raw_desired_slots
from llmbatch.core.scheduling import QueuedShard, order_queue

try:
    from benchmarks.tenant_sim import tenant_report
except ModuleNotFoundError:  # run as a script: benchmarks/ is on the path, not the repo root
    from tenant_sim import tenant_report  # type: ignore[no-redef]

TICK = 60.0
DAY = 86400.0
HORIZON = 4 * DAY
SHARD_REQUESTS = 500
THROUGHPUT = 2.0  # requests per second per slot
DRAIN = {"expedited": 600, "standard": 43200, "flex": 172800}
DEADLINE = {"expedited": DAY, "standard": DAY, "flex": 3 * DAY}
COOLDOWN = 600.0


@dataclass
class SimBatch:
    name: str
    tier: str
    arrival: float
    requests: int
    shards_left: list[int] = field(default_factory=list)
    running: int = 0
    first_start: float | None = None
    done_at: float | None = None


def make_trace(seed: int) -> list[SimBatch]:
    rng = random.Random(seed)
    batches = []
    t = 0.0
    i = 0
    while t < DAY:
        hour = t / 3600
        rate = 1 / 40 if 8 <= hour < 12 else 1 / 110  # a morning peak, quieter otherwise
        t += rng.expovariate(rate)
        if t >= DAY:
            break
        tier = rng.choices(["expedited", "standard", "flex"], weights=[1, 6, 3])[0]
        size = min(50_000, int(200 * rng.paretovariate(1.2)))
        if tier == "expedited":
            size = min(size, 5_000)
        shards = math.ceil(size / SHARD_REQUESTS)
        batches.append(SimBatch(f"b{i}", tier, t, size, list(range(shards))))
        i += 1
    return batches


def shard_seconds(batch: SimBatch, index: int) -> float:
    last = math.ceil(batch.requests / SHARD_REQUESTS) - 1
    requests = batch.requests - SHARD_REQUESTS * last if index == last else SHARD_REQUESTS
    return requests / THROUGHPUT


def finish_runs(runs: list[tuple[float, SimBatch]], now: float) -> list[tuple[float, SimBatch]]:
    """Close the shard runs finished by ``now`` (a batch is done with its last one)."""
    still = []
    for finish, batch in runs:
        if finish <= now:
            batch.running -= 1
            if not batch.shards_left and batch.running == 0:
                batch.done_at = finish
        else:
            still.append((finish, batch))
    return still


def simulate(trace: list[SimBatch], max_slots: int, ours: bool) -> dict[str, float]:
    batches = [SimBatch(b.name, b.tier, b.arrival, b.requests, list(b.shards_left)) for b in trace]
    running: list[tuple[float, SimBatch]] = []  # (finish time, batch)
    state = ScaleState(desired=0)
    provisioned = busy = waiting_time = busy_while_waiting = 0.0
    now = 0.0
    pending = sorted(batches, key=lambda b: b.arrival)
    active: list[SimBatch] = []  # arrived and not done
    while now < HORIZON:
        while pending and pending[0].arrival <= now:
            active.append(pending.pop(0))
        running = finish_runs(running, now)
        active = [b for b in active if b.done_at is None]
        arrived = [b for b in active if b.shards_left]
        if ours:
            backlog = dict.fromkeys(DRAIN, 0)
            for b in active:
                if b.done_at is None:
                    left = len(b.shards_left) + b.running
                    backlog[b.tier] += left * SHARD_REQUESTS
            raw = raw_desired_slots(backlog, THROUGHPUT, DRAIN, 0, max_slots)
            state = damp(state, raw, now, COOLDOWN)
            capacity = state.desired
            by_name = {b.name: b for b in arrived}
            queue = order_queue(
                QueuedShard(b.name, b.tier, b.arrival, i) for b in arrived for i in b.shards_left
            )
            picks = [(by_name[q.batch], q.shard_index) for q in queue]
        else:
            capacity = max_slots
            picks = [
                (b, i) for b in sorted(arrived, key=lambda b: b.arrival) for i in b.shards_left
            ]
        for batch, index in picks[: max(0, capacity - len(running))]:
            batch.shards_left.remove(index)
            batch.running += 1
            if batch.first_start is None:
                batch.first_start = now
            running.append((now + shard_seconds(batch, index), batch))
        slots = max(capacity, len(running))
        provisioned += slots * TICK
        busy += len(running) * TICK
        if any(b.shards_left for b in active):
            waiting_time += slots * TICK
            busy_while_waiting += len(running) * TICK
        now += TICK

    def within(tier: str) -> float:
        chosen = [b for b in batches if b.tier == tier]
        ok = [
            b for b in chosen if b.done_at is not None and b.done_at - b.arrival <= DEADLINE[tier]
        ]
        return 100.0 * len(ok) / max(1, len(chosen))

    waits = sorted(
        (b.first_start - b.arrival) for b in batches if b.tier == "expedited" and b.first_start
    ) or [0.0]
    return {
        "exp_wait_p50": statistics.median(waits),
        "exp_wait_p95": waits[min(len(waits) - 1, int(0.95 * len(waits)))],
        "standard_24h": within("standard"),
        "flex_72h": within("flex"),
        "busy_under_backlog": busy_while_waiting / waiting_time if waiting_time else 1.0,
        "slot_hours": provisioned / 3600,
    }


# --- engine starts: cold slots (one engine per shard) vs warm slots (one engine per slot) -------

SMALL_SHARE = 0.7
"""Share of small batches (2-100 requests) in the warm/cold trace: many small batches."""


def make_mixed_trace(seed: int) -> list[SimBatch]:
    """The day of :func:`make_trace` with most batches small (seed 000's support tickets)."""
    rng = random.Random(seed + 1000)
    batches = make_trace(seed)
    for batch in batches:
        if rng.random() < SMALL_SHARE:
            batch.requests = rng.randint(2, 100)
            batch.shards_left = [0]
    return batches


@dataclass
class Slot:
    """One slot pod: loads its engine once (``ready_at``), then runs shard after shard."""

    ready_at: float
    busy_until: float = 0.0
    idle_since: float = 0.0
    started_at: float = 0.0


def simulate_engines(
    trace: list[SimBatch], max_slots: int, engine_start: float, warm: bool, idle_seconds: float
) -> dict[str, float]:
    """Our queue order and autoscaler; a shard pays ``engine_start`` (cold) or a slot pays it
    once and stays up while work comes or for ``idle_seconds`` (warm). Slot time is split into
    loading, inferring and idle. A warm slot runs one shard at a time here: packing several
    small batches onto one engine (issue #15) would only add to the warm column."""
    batches = [SimBatch(b.name, b.tier, b.arrival, b.requests, list(b.shards_left)) for b in trace]
    pending = sorted(batches, key=lambda b: b.arrival)
    active: list[SimBatch] = []
    slots: list[Slot] = []
    runs: list[tuple[float, SimBatch]] = []  # (finish, batch)
    state = ScaleState(desired=0)
    loading = inferring = idle = 0.0
    starts = 0
    now = 0.0
    while now < HORIZON:
        while pending and pending[0].arrival <= now:
            active.append(pending.pop(0))
        runs = finish_runs(runs, now)
        active = [b for b in active if b.done_at is None]
        waiting = [b for b in active if b.shards_left]
        backlog = dict.fromkeys(DRAIN, 0)
        for b in active:
            backlog[b.tier] += sum(shard_requests(b, i) for i in b.shards_left) + b.running
        state = damp(state, raw_desired_slots(backlog, THROUGHPUT, DRAIN, 0, max_slots), now, 600)
        by_name = {b.name: b for b in waiting}
        queue = [
            (by_name[q.batch], q.shard_index)
            for q in order_queue(
                QueuedShard(b.name, b.tier, b.arrival, i) for b in waiting for i in b.shards_left
            )
        ]
        if warm:
            # Retire slots idle past idle_seconds beyond what the autoscaler wants.
            free = [s for s in slots if s.busy_until <= now and s.ready_at <= now]
            for slot in free:
                if len(slots) > state.desired and now - slot.idle_since >= idle_seconds:
                    slots.remove(slot)
            while len(slots) < min(state.desired, max_slots):
                slots.append(Slot(ready_at=now + engine_start, started_at=now, idle_since=now))
                starts += 1
                loading += engine_start
            for slot in sorted(slots, key=lambda s: s.ready_at):
                if not queue:
                    break
                start = max(now, slot.ready_at)
                if slot.busy_until > now or start > now + TICK:
                    continue
                batch, index = queue.pop(0)
                seconds = shard_seconds(batch, index)
                _start_shard(batch, index, now, runs, start + seconds)
                slot.busy_until = start + seconds
                slot.idle_since = slot.busy_until
                inferring += seconds
            idle += TICK * sum(1 for s in slots if s.busy_until <= now and s.ready_at <= now)
        else:
            room = max(0, state.desired - sum(1 for _ in runs))
            for batch, index in queue[:room]:
                seconds = shard_seconds(batch, index)
                _start_shard(batch, index, now, runs, now + engine_start + seconds)
                starts += 1
                loading += engine_start
                inferring += seconds
        now += TICK
    waits = sorted(
        (b.first_start - b.arrival) for b in batches if b.tier == "expedited" and b.first_start
    ) or [0.0]
    small = sorted(
        b.done_at - b.arrival for b in batches if b.done_at is not None and b.requests <= 100
    ) or [0.0]
    return {
        "engine_starts": float(starts),
        "loading_h": loading / 3600,
        "inferring_h": inferring / 3600,
        "idle_h": idle / 3600,
        "exp_wait_p95": waits[min(len(waits) - 1, int(0.95 * len(waits)))] / 60,
        "small_done_p50": statistics.median(small) / 60,
    }


def shard_requests(batch: SimBatch, index: int) -> int:
    last = math.ceil(batch.requests / SHARD_REQUESTS) - 1
    return batch.requests - SHARD_REQUESTS * last if index == last else SHARD_REQUESTS


def _start_shard(
    batch: SimBatch, index: int, now: float, runs: list[tuple[float, SimBatch]], finish: float
) -> None:
    batch.shards_left.remove(index)
    batch.running += 1
    if batch.first_start is None:
        batch.first_start = now
    runs.append((finish, batch))


def engine_report(seeds: int, max_slots: int, idle_seconds: float) -> None:
    """Warm vs cold for an 8B-class (45 s engine start) and a 70B-class (180 s) pool."""
    print(
        f"\nengine starts, a day with {SMALL_SHARE:.0%} small batches (2-100 requests), "
        f"{max_slots} max slots, warm slots idle out after {idle_seconds:.0f} s, "
        f"median of {seeds} seeds"
    )
    header = f"{'pool / metric':34} {'warm':>10} {'cold':>10}"
    for label, start in (("8B (engine start 45 s)", 45.0), ("70B (engine start 180 s)", 180.0)):
        results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for seed in range(seeds):
            trace = make_mixed_trace(seed)
            for warm in (True, False):
                results[warm].append(simulate_engines(trace, max_slots, start, warm, idle_seconds))
        print(f"{label}\n{header}")
        for name, key in (
            ("  engine starts", "engine_starts"),
            ("  GPU-hours loading", "loading_h"),
            ("  GPU-hours inferring", "inferring_h"),
            ("  GPU-hours warm and idle", "idle_h"),
            ("  expedited wait p95 (min)", "exp_wait_p95"),
            ("  small batch done p50 (min)", "small_done_p50"),
        ):
            w = statistics.median(r[key] for r in results[True])
            c = statistics.median(r[key] for r in results[False])
            print(f"{name:34} {w:10.2f} {c:10.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-slots", type=int, default=16)
    parser.add_argument("--idle-seconds", type=float, default=300.0)
    parser.add_argument("--tenant-rate", type=float, default=120.0, help="batches/h, tenants")
    parser.add_argument("--only-tenants", action="store_true", help="only the tenants report")
    args = parser.parse_args()
    if args.only_tenants:
        tenant_report(args.seeds, args.max_slots, args.tenant_rate)
        return
    runs: dict[str, list[dict[str, float]]] = {"ours": [], "fifo": []}
    sizes = []
    for seed in range(args.seeds):
        trace = make_trace(seed)
        sizes.append(len(trace))
        runs["ours"].append(simulate(trace, args.max_slots, ours=True))
        runs["fifo"].append(simulate(trace, args.max_slots, ours=False))
    shard_minutes = SHARD_REQUESTS / THROUGHPUT / 60
    print(
        f"trace: ~{statistics.median(sizes):.0f} batches/day, {args.max_slots} max slots, "
        f"shard = {shard_minutes:.1f} min, median of {args.seeds} seeds"
    )
    print(f"{'metric':32} {'ours':>10} {'fifo':>10}  target")
    rows = [
        ("expedited wait p50 (min)", "exp_wait_p50", 1 / 60, ""),
        ("expedited wait p95 (min)", "exp_wait_p95", 1 / 60, f"<= {shard_minutes:.1f}"),
        ("standard done in 24h (%)", "standard_24h", 1, ">= 99"),
        ("flex done in 72h (%)", "flex_72h", 1, ""),
        ("slot busy fraction under backlog", "busy_under_backlog", 1, ">= 0.9"),
        ("slot-hours provisioned", "slot_hours", 1, "< fifo"),
    ]
    for label, key, scale, target in rows:
        ours = statistics.median(r[key] for r in runs["ours"]) * scale
        fifo = statistics.median(r[key] for r in runs["fifo"]) * scale
        print(f"{label:32} {ours:10.2f} {fifo:10.2f}  {target}")
    ratio = statistics.median(r["slot_hours"] for r in runs["ours"]) / statistics.median(
        r["slot_hours"] for r in runs["fifo"]
    )
    print(f"slot-hours ratio ours/fifo: {ratio:.2f}")
    engine_report(args.seeds, args.max_slots, args.idle_seconds)
    tenant_report(args.seeds, args.max_slots, args.tenant_rate)


if __name__ == "__main__":
    main()
