"""Fair sharing of a pool's seats across tenants: recent use with a decay, each tenant's fair
share, and preemption across tenants that cannot flap (pure: data in, decisions out).

**Recent use.** Each tenant's use of a pool is its seat-seconds, decayed with the pool's
half-life ``h``: over ``dt`` seconds holding ``s`` seats, ``u' = u·e^(-λ·dt) + s·(1 - e^(-λ·dt))/λ``
with ``λ = ln 2 / h`` (exact for seats constant over ``dt``). A tenant holding ``s`` seats for
long reaches ``u = s/λ``, so ``u·λ`` is its recent use in seats (:meth:`Usage.seats`), the
figure the queue order adds to the seats it holds now (``core.scheduling``). ``h = 0``: no
memory, the order counts the seats held now only.

**Preemption across tenants** (:func:`tenant_preemptions`) takes a running shard of tenant V
for a waiting shard of tenant R only when both hold after the move:

* R was below its guarantee (``held_R < min_R``) and is at or below its fair share after
  gaining the seat (``held_R + 1 <= share_R``);
* V stays at or above both its fair share and its guarantee after losing it
  (``held_V - 1 >= max(share_V, min_V)``).

Why it cannot flap: after the move R is at or below its share, so R can never be a victim
(a victim must be strictly above its share), and V is at or above its guarantee, so V can
never be a receiver; no seat goes back from R to V while the shares stay as they are. And
every move lowers the pool's total excess ``Σ max(0, held_T - share_T)`` by exactly one (V's
falls by one, R's stays 0), an integer-stepped amount that starts finite, so moves stop.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmbatch.core.scheduling import QueuedShard, Shares
from llmbatch.core.slots import RunningShard
from llmbatch.core.tiers import TIER_RANK

#: Use decayed below this many seat-seconds is forgotten (it no longer changes the order).
FORGET_BELOW_SEAT_SECONDS = 1.0
#: Most tenants whose use a pool remembers (the largest kept): memory and status stay bounded.
MAX_REMEMBERED = 256


@dataclass(frozen=True)
class Usage:
    """A pool's decayed seat-seconds per tenant, as of ``at`` (Unix seconds)."""

    half_life: float
    """Seconds (0: nothing remembered)."""
    at: float
    seat_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """λ = ln 2 / half-life (0 when nothing is remembered)."""
        return math.log(2) / self.half_life if self.half_life > 0 else 0.0

    def seats(self) -> dict[str, float]:
        """Each tenant's recent use in seats (``u·λ``)."""
        rate = self.rate
        return {tenant: used * rate for tenant, used in self.seat_seconds.items()}

    def advance(self, seats: Mapping[str, int], now: float) -> Usage:
        """The use at ``now``, the tenants having held ``seats`` since :attr:`at`."""
        if self.half_life <= 0:
            return Usage(0.0, now)
        elapsed = max(0.0, now - self.at)
        rate = self.rate
        keep = math.exp(-rate * elapsed)
        gained = (1.0 - keep) / rate
        tenants = set(self.seat_seconds) | {t for t, n in seats.items() if n > 0}
        used = {t: self.seat_seconds.get(t, 0.0) * keep + seats.get(t, 0) * gained for t in tenants}
        kept = {t: u for t, u in used.items() if u >= FORGET_BELOW_SEAT_SECONDS}
        largest = sorted(kept, key=lambda t: (-kept[t], t))[:MAX_REMEMBERED]
        return Usage(self.half_life, now, {t: kept[t] for t in largest})


def fair_seats(weights: Mapping[str, float], total: int) -> dict[str, float]:
    """Each tenant's fair share of ``total`` seats: its weight over the weights of all (the
    tenants with work waiting or running)."""
    weight_sum = sum(weights.values())
    if weight_sum <= 0:
        return {}
    return {tenant: total * weight / weight_sum for tenant, weight in weights.items()}


def may_receive(held: int, minimum: int, share: float) -> bool:
    """A tenant holding ``held`` seats may take one by preemption: below its guarantee, and at
    or below its share once given it."""
    return held < minimum and held + 1 <= share


def may_lose(held: int, minimum: int, share: float) -> bool:
    """A tenant holding ``held`` seats may lose one by preemption: at or above both its share
    and its guarantee once it has lost it."""
    return held - 1 >= max(share, minimum)


def tenant_preemptions(
    waiting: Sequence[QueuedShard],
    running: Sequence[RunningShard],
    shares: Shares,
    total_seats: int,
    max_per_shard: int,
) -> list[tuple[RunningShard, QueuedShard]]:
    """Running shards to take back for waiting shards of tenants below their guarantee, as
    (victim, the shard its seat is for), by the rule that cannot flap (:func:`may_receive`,
    :func:`may_lose`). ``waiting``: shards no seat took, in queue order; ``running``: the
    shards on the pool's seats; ``total_seats``: the seats of the pool's open slots.

    A victim runs the receiver's model (its slot's engine serves it) and is of the same tier or
    a worse one (tiers come first); it is taken from the tenant furthest above its share, its
    worst tier and newest batch first (the least progress lost), and at most ``max_per_shard``
    times per shard."""
    share = fair_seats(dict(shares.weights), total_seats)
    held = Counter(r.shard.tenant for r in running)
    free = sorted(
        (r for r in running if r.preemptions < max_per_shard),
        key=lambda r: (-TIER_RANK.get(r.shard.tier, 9), -r.shard.created_at, r.key),
    )
    moves: list[tuple[RunningShard, QueuedShard]] = []
    for shard in waiting:
        receiver = shard.tenant
        if not may_receive(
            held[receiver], shares.guarantee(receiver).min_seats, share.get(receiver, 0.0)
        ):
            continue
        victim = _victim(shard, free, held, shares, share)
        if victim is None:
            continue
        free.remove(victim)
        held[victim.shard.tenant] -= 1
        held[receiver] += 1
        moves.append((victim, shard))
    return moves


def _victim(
    shard: QueuedShard,
    candidates: Iterable[RunningShard],
    held: Mapping[str, int],
    shares: Shares,
    share: Mapping[str, float],
) -> RunningShard | None:
    """The running shard to take back for ``shard``: of its model, not of a better tier, of a
    tenant that may lose a seat, the one furthest above its share."""
    rank = TIER_RANK.get(shard.tier, 9)
    best: tuple[float, RunningShard] | None = None
    for run in candidates:
        tenant = run.shard.tenant
        if tenant == shard.tenant or run.shard.model != shard.model:
            continue
        if TIER_RANK.get(run.shard.tier, 9) < rank:
            continue
        fair = share.get(tenant, 0.0)
        if not may_lose(held[tenant], shares.guarantee(tenant).min_seats, fair):
            continue
        above = (held[tenant] - fair) / shares.weight(tenant)
        if best is None or above > best[0]:
            best = (above, run)
    return None if best is None else best[1]
