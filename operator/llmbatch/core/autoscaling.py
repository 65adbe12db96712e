"""How many slots a pool wants: backlog per tier over per-tier drain targets, clamped, damped.

    desired = clamp(minSlots, maxSlots, ceil(sum_tier backlog_tier / (tput * drainTarget_tier)))

Throughput per slot (requests per second) is learned from finished shards as an exponentially
weighted moving average seeded from the pool spec. Scale-up is immediate; scale-down waits for a
cool-down so a momentary dip does not release slots that are needed again a minute later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

EWMA_WEIGHT = 0.3


def raw_desired_slots(
    backlog: Mapping[str, int],
    throughput_per_slot: float,
    drain_seconds: Mapping[str, int],
    min_slots: int,
    max_slots: int,
) -> int:
    """Slots needed to drain every tier's backlog within its target, clamped to the pool."""
    if throughput_per_slot <= 0:
        need = max_slots if any(backlog.values()) else 0
    else:
        load = sum(
            requests / (throughput_per_slot * max(1, drain_seconds.get(tier, 1)))
            for tier, requests in backlog.items()
            if requests > 0
        )
        need = math.ceil(load - 1e-9)
        if any(backlog.values()):
            need = max(need, 1)
    return max(min_slots, min(max_slots, need))


def learn_throughput(previous: float, requests: int, seconds: float) -> float:
    """EWMA of requests per second per slot after a shard of ``requests`` took ``seconds``."""
    if requests <= 0 or seconds <= 0:
        return previous
    observed = requests / seconds
    return observed if previous <= 0 else (1 - EWMA_WEIGHT) * previous + EWMA_WEIGHT * observed


@dataclass(frozen=True)
class ScaleState:
    """What the damper remembers between rounds (kept on the pool status)."""

    desired: int
    below_since: float | None = None
    """When the raw want first dropped below ``desired`` (None: it has not)."""


def damp(state: ScaleState, raw: int, now: float, cooldown_seconds: float) -> ScaleState:
    """Scale up at once; scale down only after ``raw`` stayed lower for the whole cool-down."""
    if raw >= state.desired:
        return ScaleState(desired=raw)
    since = state.below_since if state.below_since is not None else now
    if now - since >= cooldown_seconds:
        return ScaleState(desired=raw)
    return ScaleState(desired=state.desired, below_since=since)
