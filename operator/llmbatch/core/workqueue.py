"""The operator's work queue (pure): which batch to reconcile next, and when.

In the manner of client-go's workqueue, which Kubernetes' own controllers and Kueue use:

- **De-duplicated per key.** A key queued twice is reconciled once, at the better of its two
  priorities and the earlier of its two times. A key added while it is being reconciled is
  marked dirty and queued again when that reconcile is done, so no change is lost and no key is
  ever reconciled by two workers at once.
- **Priorities.** Cancels and deletions first, then new batches (expedited ahead of standard
  ahead of flex), then changes of shards the pool round reports, then progress folds, then the
  slow safety resync: a new or expedited batch never waits behind thousands of no-op resyncs.
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
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Priority(enum.IntEnum):
    """Lower is served first."""

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


#: Within a priority, the tier's rank orders keys (expedited first), then the time they are due.
Rank = tuple[int, int]


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


@dataclass
class _Entry(Generic[K]):
    rank: Rank
    due: float


@dataclass
class WorkQueue(Generic[K]):
    """Keys waiting to be reconciled; see the module docstring."""

    backoff: Backoff = field(default_factory=Backoff)
    rng: random.Random = field(default_factory=random.Random)
    _queued: dict[K, _Entry[K]] = field(default_factory=dict)
    _heap: list[tuple[float, Rank, int, K]] = field(default_factory=list)
    _ready: list[tuple[Rank, float, int, K]] = field(default_factory=list)
    _processing: set[K] = field(default_factory=set)
    _dirty: dict[K, _Entry[K]] = field(default_factory=dict)
    _failures: dict[K, int] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def __len__(self) -> int:
        return len(self._queued) + len(self._dirty)

    def add(self, key: K, priority: Priority, now: float, *, due: float | None = None,
            tier_rank: int = 1) -> None:  # fmt: skip
        """Queue ``key`` for ``due`` (default: now). Queued already: the better priority and
        the earlier time win. Being reconciled: queued again once it is done."""
        entry: _Entry[K] = _Entry((int(priority), tier_rank), now if due is None else due)
        if key in self._processing:
            self._dirty[key] = _better(self._dirty.get(key), entry)
            return
        current = self._queued.get(key)
        best = _better(current, entry)
        if best == current:
            return
        self._queued[key] = best
        heapq.heappush(self._heap, (best.due, best.rank, next(self._seq), key))

    def pop(self, now: float) -> K | None:
        """The key to reconcile now (best priority among those due), or None; the caller must
        call :meth:`done` or :meth:`failed` with it."""
        self._promote(now)
        while self._ready:
            rank, due, _, key = heapq.heappop(self._ready)
            entry = self._queued.get(key)
            if entry is None or (entry.rank, entry.due) != (rank, due):
                continue  # superseded by a better add
            del self._queued[key]
            self._processing.add(key)
            return key
        return None

    def next_due(self) -> float | None:
        """When the next key becomes due (None: nothing queued); now or earlier if one is."""
        if self._ready:
            return float("-inf")
        while self._heap:
            due, rank, _, key = self._heap[0]
            entry = self._queued.get(key)
            if entry is not None and (entry.rank, entry.due) == (rank, due):
                return due
            heapq.heappop(self._heap)
        return None

    def waiting(self, now: float, priority: Priority) -> bool:
        """Whether a key of ``priority`` or better is due and not yet handed out."""
        self._promote(now)
        while self._ready:
            rank, due, _, key = self._ready[0]
            entry = self._queued.get(key)
            if entry is None or (entry.rank, entry.due) != (rank, due):
                heapq.heappop(self._ready)  # superseded by a better add
                continue
            return rank[0] <= priority
        return False

    def done(self, key: K, now: float) -> None:
        """``key`` was reconciled: its failures are forgotten; what was added meanwhile is
        queued now."""
        self._processing.discard(key)
        self._failures.pop(key, None)
        self._requeue_dirty(key, now)

    def failed(self, key: K, now: float, priority: Priority) -> float:
        """``key``'s reconcile failed: it is queued again after the backoff (sooner if it was
        added meanwhile). The delay."""
        self._processing.discard(key)
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures, self.rng)
        self.add(key, priority, now, due=now + delay)
        self._requeue_dirty(key, now)
        return delay

    def forget(self, key: K) -> None:
        """Drop ``key`` entirely (its object is gone)."""
        self._queued.pop(key, None)
        self._dirty.pop(key, None)
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def _requeue_dirty(self, key: K, now: float) -> None:
        dirty = self._dirty.pop(key, None)
        if dirty is not None:
            priority = Priority(dirty.rank[0])
            self.add(key, priority, now, due=dirty.due, tier_rank=dirty.rank[1])

    def _promote(self, now: float) -> None:
        """Move the keys that are due from the time heap to the priority heap."""
        while self._heap and self._heap[0][0] <= now:
            due, rank, seq, key = heapq.heappop(self._heap)
            entry = self._queued.get(key)
            if entry is not None and (entry.rank, entry.due) == (rank, due):
                heapq.heappush(self._ready, (rank, due, seq, key))


def _better(current: _Entry[K] | None, new: _Entry[K]) -> _Entry[K]:
    """One entry from two adds of a key: the better rank and the earlier time."""
    if current is None:
        return new
    rank = min(current.rank, new.rank)
    due = min(current.due, new.due)
    if (rank, due) == (current.rank, current.due):
        return current
    return _Entry(rank, due)
