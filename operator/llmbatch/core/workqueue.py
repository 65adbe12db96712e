"""The operator's work queue (pure): which batch to reconcile next, and when.

In the manner of client-go's workqueue, which Kubernetes' own controllers and Kueue use:

- **De-duplicated per key.** A key queued twice is reconciled once, at the better of its two
  priorities and the earlier of its two times. A key added while it is being reconciled is
  marked dirty and queued again when that reconcile is done, so no change is lost and no key is
  ever reconciled by two workers at once.
- **Priorities, then tiers** (:func:`rank_of`). Cancels and deletions first; then a batch's
  acceptance and the changes of its shards (its finalisation among them), ordered by its tier
  first — expedited ahead of standard ahead of flex — and within a tier acceptance ahead of
  shard changes; then progress folds, then the slow safety resync. So a new or expedited batch
  never waits behind thousands of no-op resyncs, and an expedited batch's later steps never
  wait behind a flood of acceptances of a lower tier.
- **Tenants take turns.** Keys of one rank wait in one lane per tenant, and the lanes are
  served round-robin, each lane in the order its keys became due: one tenant's flood of new
  batches puts another tenant's batch of the same rank at most one place further back per
  tenant waiting, not behind the whole flood.
- **Times.** A key can be asked for at a time (its expiry, a retry backoff): it is not handed
  out before.
- **Backoff.** A failed reconcile is retried after an exponential backoff with jitter, reset by
  the next success.

Work therefore follows change: a batch nothing happened to costs nothing but its resync.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import random
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Priority(enum.IntEnum):
    """Why a key is queued; lower is more urgent (:func:`rank_of` orders them with tiers)."""

    URGENT = 0
    """A cancel requested, a batch being deleted."""
    ADMIT = 1
    """A new batch (or a spec change): validation and acceptance."""
    SHARDS = 2
    """Something about its shards changed (granted, started, ended, lost), or a time it asked
    for (expiry) has come."""
    PROGRESS = 3
    """Its shards made progress: fold the counts."""
    RESYNC = 4
    """The slow safety net: nothing is known to have changed."""


Rank = tuple[int, int, int]
"""(band, tier rank, priority): lower is served first (:func:`rank_of`)."""

#: The band of each priority: acceptance and shard changes share one, ordered by tier first.
_BAND = {
    Priority.URGENT: 0,
    Priority.ADMIT: 1,
    Priority.SHARDS: 1,
    Priority.PROGRESS: 2,
    Priority.RESYNC: 3,
}


def rank_of(priority: Priority, tier_rank: int) -> Rank:
    """Where a key of ``priority`` of a batch of tier ``tier_rank`` (0: expedited) is served:
    by band (urgent; acceptance and shard changes; progress; resync), then by tier, then by
    priority. An expedited batch's finalisation thus goes ahead of standard and flex
    acceptances, and a standard one's ahead of flex acceptances."""
    return (_BAND[priority], tier_rank, int(priority))


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff of failed reconciles: ``base`` doubled per failure up to ``cap``,
    ±``jitter`` of it at random (so keys that failed together do not retry together)."""

    base: float = 0.5
    cap: float = 60.0
    jitter: float = 0.1

    def delay(self, failures: int, rng: random.Random) -> float:
        raw = min(self.cap, self.base * 2.0 ** max(0, failures - 1))
        return float(raw * (1 + rng.uniform(-self.jitter, self.jitter)))


@dataclass(frozen=True, eq=False)
class _Entry:
    """One queued add of a key; the key's current entry is the only live one (identity)."""

    rank: Rank
    due: float
    tenant: str
    tier_rank: int
    seq: int

    @property
    def priority(self) -> Priority:
        return Priority(self.rank[2])


_Item = tuple[float, int, K, _Entry]
"""(due, sequence, key, entry): heaps order by time, then by the order of the adds."""


@dataclass
class _Lanes(Generic[K]):
    """The due keys of one rank: a lane per tenant, the tenants served in turn."""

    lanes: dict[str, list[_Item[K]]] = field(default_factory=dict)
    turns: deque[str] = field(default_factory=deque)

    def push(self, item: _Item[K]) -> None:
        tenant = item[3].tenant
        lane = self.lanes.get(tenant)
        if lane is None:
            lane = self.lanes[tenant] = []
            self.turns.append(tenant)  # a tenant that starts waiting takes the last turn
        heapq.heappush(lane, item)

    def pop(self, live: dict[K, _Entry]) -> K | None:
        """The head of the next tenant's lane that has a live key; that tenant's turn passes."""
        while self.turns:
            tenant = self.turns.popleft()
            lane = self.lanes[tenant]
            _prune(lane, live)
            if not lane:
                del self.lanes[tenant]
                continue
            key = heapq.heappop(lane)[2]
            if lane:
                self.turns.append(tenant)
            else:
                del self.lanes[tenant]
            return key
        return None

    def has_live(self, live: dict[K, _Entry]) -> bool:
        """Whether a live key waits (tenants whose lanes hold only superseded ones leave)."""
        while self.turns:
            tenant = self.turns[0]
            lane = self.lanes[tenant]
            _prune(lane, live)
            if lane:
                return True
            del self.lanes[tenant]
            self.turns.popleft()
        return False


def _prune(heap: list[_Item[K]], live: dict[K, _Entry]) -> None:
    """Drop superseded items from the top of ``heap``."""
    while heap and live.get(heap[0][2]) is not heap[0][3]:
        heapq.heappop(heap)


@dataclass
class WorkQueue(Generic[K]):
    """Keys waiting to be reconciled; see the module docstring."""

    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    _queued: dict[K, _Entry] = field(default_factory=dict)
    _heap: list[_Item[K]] = field(default_factory=list)
    """Queued keys not yet due, by time."""
    _ready: dict[Rank, _Lanes[K]] = field(default_factory=dict)
    """Due keys by rank."""
    _processing: dict[K, _Entry] = field(default_factory=dict)
    """Keys handed out, with the entry they were handed out under."""
    _dirty: dict[K, _Entry] = field(default_factory=dict)
    _failures: dict[K, int] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self._queued) + len(self._dirty)

    def add(self, key: K, priority: Priority, now: float, *, due: float | None = None,
            tier_rank: int = 1, tenant: str = "") -> None:  # fmt: skip
        """Queue ``key`` (of ``tenant``'s batch of tier ``tier_rank``) for ``due`` (default:
        now). Queued already: the better priority and the earlier time win. Being reconciled:
        queued again once it is done."""
        rank = rank_of(priority, tier_rank)
        entry = _Entry(rank, now if due is None else due, tenant, tier_rank, next(self._seq))
        if key in self._processing:
            self._dirty[key] = self._better(self._dirty.get(key), entry)
        else:
            self._enqueue(key, entry)

    def pop(self, now: float) -> K | None:
        """The key to reconcile now (best rank among those due, tenants in turn), or None; the
        caller must call :meth:`done` or :meth:`failed` with it."""
        self._promote(now)
        for rank in sorted(self._ready):
            lanes = self._ready[rank]
            key = lanes.pop(self._queued)
            if not lanes.turns:
                del self._ready[rank]
            if key is not None:
                self._processing[key] = self._queued.pop(key)
                return key
        return None

    def next_due(self) -> float | None:
        """When the next key becomes due (None: nothing queued); now or earlier if one is."""
        if self._ready_ranks():
            return float("-inf")
        _prune(self._heap, self._queued)
        return self._heap[0][0] if self._heap else None

    def waiting(self, now: float, priority: Priority) -> bool:
        """Whether a key queued for ``priority`` or better is due and not yet handed out."""
        self._promote(now)
        return any(rank[2] <= priority for rank in self._ready_ranks())

    def done(self, key: K, now: float) -> None:
        """``key`` was reconciled: its failures are forgotten; what was added meanwhile is
        queued now."""
        self._processing.pop(key, None)
        self._failures.pop(key, None)
        self._requeue_dirty(key)

    def failed(self, key: K, now: float, priority: Priority) -> float:
        """``key``'s reconcile failed: it is queued again at ``priority`` after the backoff
        (sooner if it was added meanwhile). The delay."""
        handed = self._processing.pop(key, None)
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures, self.rng)
        tier, tenant = (1, "") if handed is None else (handed.tier_rank, handed.tenant)
        self.add(key, priority, now, due=now + delay, tier_rank=tier, tenant=tenant)
        self._requeue_dirty(key)
        return delay

    def forget(self, key: K) -> None:
        """Drop ``key`` entirely (its object is gone)."""
        self._queued.pop(key, None)
        self._dirty.pop(key, None)
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def _better(self, current: _Entry | None, new: _Entry) -> _Entry:
        """One entry from two adds of a key: the better rank and the earlier time."""
        if current is None:
            return new
        rank, due = min(current.rank, new.rank), min(current.due, new.due)
        if (rank, due) == (current.rank, current.due):
            return current
        if (rank, due) == (new.rank, new.due):
            return new
        return _Entry(rank, due, new.tenant, new.tier_rank, next(self._seq))

    def _requeue_dirty(self, key: K) -> None:
        dirty = self._dirty.pop(key, None)
        if dirty is not None:
            self._enqueue(key, dirty)

    def _enqueue(self, key: K, entry: _Entry) -> None:
        """Queue ``entry`` for ``key``, merged with what is queued for it already."""
        current = self._queued.get(key)
        best = self._better(current, entry)
        if best is not current:
            self._queued[key] = best
            heapq.heappush(self._heap, (best.due, best.seq, key, best))

    def _promote(self, now: float) -> None:
        """Move the keys that are due from the time heap to their rank's lanes."""
        while self._heap and self._heap[0][0] <= now:
            item = heapq.heappop(self._heap)
            if self._queued.get(item[2]) is item[3]:
                lanes = self._ready.get(item[3].rank)
                if lanes is None:
                    lanes = self._ready[item[3].rank] = _Lanes()
                lanes.push(item)

    def _ready_ranks(self) -> list[Rank]:
        """The ranks with a due key not handed out (emptied ranks are dropped)."""
        for rank in [r for r, lanes in self._ready.items() if not lanes.has_live(self._queued)]:
            del self._ready[rank]
        return list(self._ready)
