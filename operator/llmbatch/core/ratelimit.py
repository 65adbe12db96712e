"""Request rate limits per API key: a token bucket each (no I/O; time comes from its clock).

A key may send ``burst`` requests at once and ``rate`` per second after that; a request over the
limit is refused with the seconds until the key's next token, which the gateway answers as 429
with ``Retry-After``. Buckets of keys that have been idle long enough to be full again are
forgotten, so memory follows the keys in use, not every key ever seen.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PRUNE_EVERY = 1024
"""Admissions between two sweeps of the buckets that are full again."""


@dataclass
class TokenBucket:
    """Up to ``burst`` tokens, refilled at ``rate`` per second; a request takes one."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = max(self.updated, now)

    def take(self, now: float) -> float | None:
        """Take a token at ``now``: None when there was one, else the seconds until there is."""
        self.refill(now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate


@dataclass
class KeyRateLimiter:
    """A token bucket per key; ``rate`` 0 turns the limit off."""

    rate: float
    burst: int
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _admitted: int = 0

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def admit(self, key: str) -> float | None:
        """Whether ``key`` may send a request now: None, or the seconds it must wait."""
        if not self.enabled:
            return None
        now = self.clock()
        self._admitted += 1
        if self._admitted % PRUNE_EVERY == 0:
            self._prune(now)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self.burst, now)
        return bucket.take(now)

    def _prune(self, now: float) -> None:
        full_after = self.burst / self.rate
        idle = [k for k, b in self._buckets.items() if now - b.updated >= full_after]
        for key in idle:
            del self._buckets[key]


def retry_after_header(seconds: float) -> str:
    """``Retry-After`` in whole seconds, never 0 (a client told 0 would retry at once)."""
    return str(max(1, math.ceil(seconds)))
