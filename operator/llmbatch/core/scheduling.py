"""Which waiting shards get the free slots of a pool.

Order: tier first (expedited > standard > flex, as the seeds require); within a tier, the tenant
furthest below its fair share of the pool's seats; within a tenant, round-robin across its
batches (every batch's first waiting shard before any batch's second, so one huge batch cannot
starve a small one), then batch creation time, then shard index.

A tenant's fair share is its weight over the weights of the tenants with work waiting or
running (:class:`Shares`): the queue hands each next seat to the tenant with the fewest seats
per unit of weight, counting the seats it holds now and those this order has given it already.
Nothing is reserved: a tenant with nothing waiting takes no turn, so its share goes to whoever
has work (work-conserving), and comes back to it as seats free — a tenant's first batch created
behind another tenant's thousand goes first at the next free seat, not after them.

A tenant's load also counts its recent use of the pool (:attr:`Shares.usage`, decayed with the
pool's half-life: ``core.fairshare``), so a tenant that held many seats a moment ago yields to
one that did not. The pool's guarantees per named tenant (:class:`Guarantee`) come on top: a
tenant below its minimum seats goes first within its tier, and one at its maximum gets no seat
at all (its shards wait; :func:`capped`).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from llmbatch.core.tiers import TIER_RANK

#: The namespace annotation of a tenant's weight in every pool's fair sharing (default 1).
WEIGHT_ANNOTATION = "llmbatch.io/fair-share-weight"
#: Weights outside this range are clamped: 0 would starve a tenant, a huge one starve the rest.
MIN_WEIGHT, MAX_WEIGHT = 0.01, 1000.0


def tenant_weight(annotations: Mapping[str, str] | None) -> float:
    """A tenant's weight from its namespace's annotations: 1 when unset or not a number."""
    raw = (annotations or {}).get(WEIGHT_ANNOTATION, "")
    try:
        weight = float(raw)
    except ValueError:
        return 1.0
    if weight != weight:  # NaN
        return 1.0
    return min(MAX_WEIGHT, max(MIN_WEIGHT, weight))


def revision_to_serve(pinned: str | None, current: str | None) -> str | None:
    """The revision a shard runs and a slot for it loads: the one its batch pinned at
    acceptance; a batch accepted before revisions were recorded (or an empty slot) gets the
    pool model's ``current`` one."""
    return pinned or current


def serving_key(model: str, revision: str | None) -> str:
    """What a slot serves and a shard needs: the model, and the revision pinned if any
    (``name@revision``). Slots and shards match on it, so a batch pinned to one revision never
    runs on a slot of another (seed 000: "submission pins the model revision")."""
    return f"{model}@{revision}" if revision else model


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
    """What a slot must serve to run it: its batch's model and pinned revision
    (:func:`serving_key`; a slot serves one)."""
    revision: str | None = None
    """The model revision its batch pinned at acceptance (None: the pool's current one)."""

    @property
    def tenant(self) -> str:
        """The tenant: the batch's namespace."""
        return self.batch.partition("/")[0]

    @property
    def model_name(self) -> str:
        """The model's name alone (``model`` without the pinned revision)."""
        return self.model.removesuffix(f"@{self.revision}") if self.revision else self.model


def unserved(pool: str, served: Collection[str], shard: QueuedShard) -> str | None:
    """Why ``shard`` can no longer run on ``pool`` (its model was removed from the pool after
    the batch was accepted), or None while the pool serves it. A shard pinned to a revision the
    pool no longer names is still served: a slot of that revision starts from the pool's current
    spec while its weights are there (``docs/pools.md``)."""
    if shard.model_name in served:
        return None
    pinned = f" (revision {shard.revision})" if shard.revision else ""
    return (
        f"pool {pool} no longer serves model {shard.model_name!r}{pinned}, which the batch was"
        f" accepted for; the model was removed from the pool (serves: {', '.join(sorted(served))})"
    )


@dataclass(frozen=True)
class Guarantee:
    """What a pool guarantees a named tenant: seats served before any tenant's fair share
    (``min_seats``), and a hard cap on its seats (``max_seats``; None: none)."""

    min_seats: int = 0
    max_seats: int | None = None


@dataclass(frozen=True)
class Shares:
    """What the tenants of a pool hold now, their weights, recent use and guarantees."""

    seats: Mapping[str, int] = field(default_factory=dict)
    """Shards each tenant has on the pool's slots (running, or queued on a slot)."""
    weights: Mapping[str, float] = field(default_factory=dict)
    """Each tenant's weight (:func:`tenant_weight`); absent: 1."""
    usage: Mapping[str, float] = field(default_factory=dict)
    """Each tenant's recent use in seats (its decayed seat-seconds over the mean life of the
    decay, ``core.fairshare.Usage.seats``); absent: 0."""
    guarantees: Mapping[str, Guarantee] = field(default_factory=dict)
    """The pool's guarantees by tenant; absent: none."""

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def guarantee(self, tenant: str) -> Guarantee:
        return self.guarantees.get(tenant, NO_GUARANTEE)


NO_GUARANTEE = Guarantee()


def _within_tenant(shards: list[QueuedShard]) -> list[QueuedShard]:
    """One tenant's waiting shards of one tier: round-robin across its batches, then creation
    time (the order of the whole queue before shares by tenant)."""
    by_batch: dict[str, list[QueuedShard]] = {}
    for shard in shards:
        by_batch.setdefault(shard.batch, []).append(shard)
    keyed = [
        ((turn, shard.created_at, shard.batch, shard.shard_index), shard)
        for batch_shards in by_batch.values()
        for turn, shard in enumerate(sorted(batch_shards, key=lambda s: s.shard_index))
    ]
    keyed.sort(key=lambda item: item[0])
    return [shard for _, shard in keyed]


def order_queue(waiting: Iterable[QueuedShard], shares: Shares | None = None) -> list[QueuedShard]:
    """The waiting shards in the order they get slots; a tenant's shards beyond its maximum
    seats are left out (:func:`split_queue` returns them)."""
    return split_queue(waiting, shares)[0]


def split_queue(
    waiting: Iterable[QueuedShard], shares: Shares | None = None
) -> tuple[list[QueuedShard], list[QueuedShard]]:
    """(The shards in the order they get slots, those no seat may take: their tenant would
    exceed its maximum seats.)"""
    shares = shares or Shares()
    by_tier: dict[int, dict[str, list[QueuedShard]]] = {}
    for shard in waiting:
        rank = TIER_RANK.get(shard.tier, len(TIER_RANK))
        by_tier.setdefault(rank, {}).setdefault(shard.tenant, []).append(shard)
    held = dict(shares.seats)
    ordered: list[QueuedShard] = []
    left_out: list[QueuedShard] = []
    for rank in sorted(by_tier):
        queues = {tenant: _within_tenant(shards) for tenant, shards in by_tier[rank].items()}
        heap = [(_key(t, held, shares), q[0].created_at, t) for t, q in queues.items()]
        heapq.heapify(heap)
        taken = dict.fromkeys(queues, 0)
        while heap:
            _, _, tenant = heapq.heappop(heap)
            queue = queues[tenant]
            cap = shares.guarantee(tenant).max_seats
            if cap is not None and held.get(tenant, 0) >= cap:
                left_out += queue[taken[tenant] :]
                continue
            ordered.append(queue[taken[tenant]])
            taken[tenant] += 1
            held[tenant] = held.get(tenant, 0) + 1
            if taken[tenant] < len(queue):
                head = queue[taken[tenant]]
                heapq.heappush(heap, (_key(tenant, held, shares), head.created_at, tenant))
    return ordered, left_out


def _key(tenant: str, held: Mapping[str, int], shares: Shares) -> tuple[bool, float]:
    """(not below its minimum seats, its load per unit of weight once given one more seat):
    a tenant below its guarantee first, then the tenant furthest below its share. The load is
    the seats it holds (and was given in this order) plus its recent use. (Counting the next
    seat, not the held ones, breaks the tie between an idle light tenant and an idle heavy one
    in favour of the heavier.)"""
    seats = held.get(tenant, 0)
    below_minimum = seats < shares.guarantee(tenant).min_seats
    load = seats + shares.usage.get(tenant, 0.0) + 1
    return (not below_minimum, load / shares.weight(tenant))


def grant_slots(
    waiting: Iterable[QueuedShard], running: int, capacity: int, shares: Shares | None = None
) -> list[QueuedShard]:
    """The shards to start now: the head of the queue, as many as there are free slots."""
    free = max(0, capacity - running)
    return order_queue(waiting, shares)[:free]
