"""Coalesced, briefly cached reads of single objects.

A burst of polls of the same batch (many clients, or one impatient one) should not cost the API
server one GET per request. A request joins a GET of the same object already in flight, and an
answer younger than a short TTL (``LLMBATCH_GATEWAY_READ_CACHE_SECONDS``, default 1 s, 0 = off)
is served again. Past the TTL a poll starts (or joins) one GET that refreshes it and waits for
it up to :data:`STALE_WAIT_SECONDS`: the fresh answer when the API server is quick, else the
cached one while the GET goes on, so a slow API server never holds up a poll for long and a
client that polls once (say, after a webhook) still sees status the operator wrote since. Writes
through the gateway (create, cancel, delete) update the entry, so a client reads its own writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

from llmbatch.gateway.kube import KubeAPI

Key = tuple[str, str, str]
log = logging.getLogger(__name__)
#: How long a poll past the TTL waits for the refreshing GET before it takes the cached answer.
STALE_WAIT_SECONDS = 0.02


class ReadCache:
    def __init__(self, kube: KubeAPI, ttl_seconds: float = 0.0, max_entries: int = 1024) -> None:
        self.kube = kube
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        self._inflight: dict[Key, asyncio.Future[dict[str, Any] | None]] = {}
        self._entries: OrderedDict[Key, tuple[float, dict[str, Any] | None]] = OrderedDict()
        self.grace = max(5.0, 5 * ttl_seconds)
        self._background: set[asyncio.Task[dict[str, Any] | None]] = set()
        self.api_calls = 0
        self.coalesced = 0

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object (treat it as read-only: it may be shared with other requests).

        Fresh entries are answered at once; an entry past its TTL (but younger than the grace
        period) is refreshed by one GET, awaited up to :data:`STALE_WAIT_SECONDS`: its answer
        if it came, else the cached one (the GET goes on and updates the entry).
        """
        key = (plural, namespace, name)
        if self.ttl > 0:
            hit = self._entries.get(key)
            if hit is not None:
                now = time.monotonic()
                if hit[0] > now:
                    return hit[1]
                if hit[0] + self.grace > now:
                    return await self._refreshed(key, hit[1])
        pending = self._inflight.get(key)
        if pending is not None:
            self.coalesced += 1
            return await asyncio.shield(pending)
        return await self._fetch(key)

    async def _refreshed(self, key: Key, cached: dict[str, Any] | None) -> dict[str, Any] | None:
        """The answer of the GET refreshing ``key`` if it comes within the wait, else ``cached``."""
        refresh: asyncio.Future[dict[str, Any] | None] | None = self._inflight.get(key)
        if refresh is None:
            task = asyncio.create_task(self._fetch(key))
            self._background.add(task)
            task.add_done_callback(self._background_done)
            refresh = task
        try:
            return await asyncio.wait_for(asyncio.shield(refresh), STALE_WAIT_SECONDS)
        except Exception:  # too slow, or failed: the cached answer (a failure is logged)
            return cached

    def _background_done(self, task: asyncio.Task[dict[str, Any] | None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.debug("background refresh failed: %r", task.exception())

    async def _fetch(self, key: Key) -> dict[str, Any] | None:
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self.api_calls += 1
        try:
            obj = await self.kube.get(*key)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # retrieved here: joiners re-raise it, nobody else must
            else:
                future.cancel()
            raise
        finally:
            del self._inflight[key]
        future.set_result(obj)
        self._remember(key, obj)
        return obj

    def put(self, plural: str, namespace: str, name: str, obj: dict[str, Any] | None) -> None:
        """An object the gateway just wrote (or deleted: ``None``)."""
        self._remember((plural, namespace, name), obj)

    def forget(self, namespace: str) -> None:
        """The namespace of that name went: nothing read of it is answered again (a later
        namespace of the same name is another tenant)."""
        for key in [k for k in self._entries if k[1] == namespace]:
            del self._entries[key]

    def _remember(self, key: Key, obj: dict[str, Any] | None) -> None:
        if self.ttl <= 0:
            return
        self._entries[key] = (time.monotonic() + self.ttl, obj)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
