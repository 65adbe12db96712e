"""The running batches by pool, for the pool rounds: one listing at start, then the watch.

A pool round needs every running batch of its pool (its shards to place, its backlog to size
the pool) without listing Batches. kopf's own indexes would keep this, but kopf holds every
handler until each object of an indexed kind has been indexed, and its readiness bookkeeping
costs a wake-up of every waiting object per object listed — quadratic in the Batches present:
a restart with 5,000 batches spent minutes there before serving a new one. So the operator keeps
the index itself: :meth:`RunningIndex.seed` lists the Batches once at start (before kopf's
watches begin: the watch's own first listing is at least as new), the Batch watch handler
(``handlers.batch_seen``) applies each change. The listing runs in kopf's startup (``configure``),
before any timer, so a restarted operator's first pool round still sees every running batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any


def running_entry(batch: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What a pool round needs of a batch, keyed by its pool while it runs (``{}`` otherwise)."""
    status = batch.get("status") or {}
    pool = status.get("pool")
    if status.get("status") != "in_progress" or not pool:
        return {}
    meta, spec = batch["metadata"], batch.get("spec") or {}
    return {
        str(pool): {
            "metadata": {k: meta.get(k) for k in ("uid", "namespace", "name")},
            "spec": {"priority": spec.get("priority"), "metadata": spec.get("metadata")},
            "status": dict(status),
        }
    }


class RunningIndex:
    """Running batches by pool, by uid."""

    def __init__(self) -> None:
        self._by_pool: dict[str, dict[str, dict[str, Any]]] = {}
        self._pool_of: dict[str, str] = {}

    def notice(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        uid = str(body["metadata"]["uid"])
        before = self._pool_of.pop(uid, None)
        if before is not None:
            self._by_pool.get(before, {}).pop(uid, None)
        if deleted:
            return
        for pool, entry in running_entry(body).items():
            self._by_pool.setdefault(pool, {})[uid] = entry
            self._pool_of[uid] = pool

    async def seed(
        self, batches: AsyncIterable[dict[str, Any]], served: Callable[[str], bool]
    ) -> int:
        """Take in one listing of every Batch (the ones in served namespaces)."""
        count = 0
        async for body in batches:
            if served((body.get("metadata") or {}).get("namespace") or ""):
                self.notice(body)
                count += 1
        return count

    def get(self, pool: str) -> list[dict[str, Any]]:
        """The pool's running batches (read only)."""
        return list(self._by_pool.get(pool, {}).values())
