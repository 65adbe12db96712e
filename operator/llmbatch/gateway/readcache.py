"""Coalesced, briefly cached reads of single objects.

A burst of polls of the same batch (many clients, or one impatient one) should not cost the API
server one GET per request. A request joins a GET of the same object already in flight, and an
answer younger than a short TTL (``LLMBATCH_GATEWAY_READ_CACHE_SECONDS``, default 1 s, 0 = off)
is served again (past the TTL it is still answered while one background GET refreshes it): status
the operator writes shows up about that much later. Writes through the
gateway (create, cancel, delete) update the entry, so a client reads its own writes.
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
        period) is answered at once too while one background GET refreshes it, so a slow API
        server never holds up a poll that has an answer to give.
        """
        key = (plural, namespace, name)
        if self.ttl > 0:
            hit = self._entries.get(key)
            if hit is not None:
                now = time.monotonic()
                if hit[0] > now:
                    return hit[1]
                if hit[0] + self.grace > now:
                    if key not in self._inflight:
                        task = asyncio.create_task(self._fetch(key))
                        self._background.add(task)
                        task.add_done_callback(self._background_done)
                    return hit[1]
        pending = self._inflight.get(key)
        if pending is not None:
            self.coalesced += 1
            return await asyncio.shield(pending)
        return await self._fetch(key)

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

    def _remember(self, key: Key, obj: dict[str, Any] | None) -> None:
        if self.ttl <= 0:
            return
        self._entries[key] = (time.monotonic() + self.ttl, obj)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
