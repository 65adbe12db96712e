"""The BatchPools as this operator's watch shows them.

Acceptance picks a batch's pool from here instead of listing every BatchPool from the API
server for each batch: under a burst of batches that listing was the slowest call of the
acceptance (0.5 s at the median, with 200 batches arriving at once on the local cluster), and
it loaded the API server the other calls wait on. A pool the watch has not shown yet (created
a moment before the batch) is looked up in a fresh listing before a batch is refused for it;
a pool chosen from the watch is confirmed by reading it at most every CONFIRM_SECONDS (a watch
that restarts lists the pools again but reports none deleted meanwhile), and a pool being
deleted is never chosen.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from llmbatch.core.admission import choose_pool
from llmbatch.core.tenancy import Tenant

Listing = Callable[[], Awaitable[list[dict[str, Any]]]]
Reading = Callable[[str], Awaitable[dict[str, Any] | None]]

#: How long a pool read from the API server counts as confirming the watch's view of it.
CONFIRM_SECONDS = 2.0


class PoolCatalog:
    """BatchPools by name, kept from watch events (:meth:`notice`)."""

    def __init__(
        self,
        listing: Listing,
        reading: Reading,
        clock: Callable[[], float] = time.monotonic,
        served: Callable[[str], bool] = lambda _: True,
    ) -> None:
        self._listing = listing
        self._reading = reading
        self._clock = clock
        self._served = served
        """The pools this operator may choose (``LLMBATCH_POOLS``)."""
        self._pools: dict[str, dict[str, Any]] = {}
        self._confirmed: dict[str, float] = {}  # name -> when last read from the API server

    def notice(self, body: dict[str, Any], *, deleted: bool = False) -> None:
        """A watch event of a BatchPool (its body as the event carried it)."""
        name = (body.get("metadata") or {}).get("name")
        if not name or not self._served(name):
            return
        if deleted or (body.get("metadata") or {}).get("deletionTimestamp"):
            self._pools.pop(name, None)
            self._confirmed.pop(name, None)
        else:
            self._pools[name] = body

    async def choose(
        self, model: str, wanted: str | None, tenant: Tenant | None = None
    ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The pool serving ``model`` (named ``wanted``, if given; to ``tenant``, if given), as
        the API server would list it: from the watch when it shows one, else from a fresh
        listing; with the pools it was chosen from (for the message when none serves the
        model)."""
        known = [self._pools[name] for name in sorted(self._pools)]  # API order: by name
        chosen = choose_pool(known, model, wanted, tenant)
        if chosen is not None and await self._confirm(chosen["metadata"]["name"]):
            return self._pools[chosen["metadata"]["name"]], known
        listed = await self._listing()
        live = [
            p
            for p in listed
            if not (p.get("metadata") or {}).get("deletionTimestamp")
            and self._served(str((p.get("metadata") or {}).get("name") or ""))
        ]
        return choose_pool(live, model, wanted, tenant), live

    async def _confirm(self, name: str) -> bool:
        """Whether pool ``name`` still exists (read at most every :data:`CONFIRM_SECONDS`)."""
        now = self._clock()
        if now - self._confirmed.get(name, -CONFIRM_SECONDS) < CONFIRM_SECONDS:
            return True
        body = await self._reading(name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            self.notice({"metadata": {"name": name}}, deleted=True)
            return False
        self._pools[name] = body
        self._confirmed[name] = now
        return True
