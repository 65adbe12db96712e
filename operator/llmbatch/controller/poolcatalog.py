"""The BatchPools as this operator's watch shows them.

Acceptance picks a batch's pool from here instead of listing every BatchPool from the API
server for each batch: under a burst of batches that listing was the slowest call of the
acceptance (0.5 s at the median, with 200 batches arriving at once on the local cluster), and
it loaded the API server the other calls wait on. A pool the watch has not shown yet (created
a moment before the batch) is looked up in a fresh listing before a batch is refused for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmbatch.core.admission import choose_pool

Listing = Callable[[], Awaitable[list[dict[str, Any]]]]


class PoolCatalog:
    """BatchPools by name, kept from watch events (:meth:`notice`)."""

    def __init__(self, listing: Listing) -> None:
        self._listing = listing
        self._pools: dict[str, dict[str, Any]] = {}

    def notice(self, body: dict[str, Any], *, deleted: bool = False) -> None:
        """A watch event of a BatchPool (its body as the event carried it)."""
        name = (body.get("metadata") or {}).get("name")
        if not name:
            return
        if deleted:
            self._pools.pop(name, None)
        else:
            self._pools[name] = body

    async def choose(
        self, model: str, wanted: str | None
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The pool serving ``model`` (named ``wanted``, if given), as the API server would list
        it: from the watch when it shows one, else from a fresh listing; with the pools it was
        chosen from (for the message when none serves the model)."""
        known = [self._pools[name] for name in sorted(self._pools)]  # API order: by name
        chosen = choose_pool(known, model, wanted)
        if chosen is not None:
            return chosen, known
        listed = await self._listing()
        return choose_pool(listed, model, wanted), listed
