"""Keep an in-memory view equal to a kind of Kubernetes objects: list, then watch, again.

The gateway's API keys (Secrets in the keys namespace) and its view of the tenant namespaces
are each a :class:`Reflector` feeding a :class:`View`: a listing replaces the view whole, each
watch event then changes it, and after ``resync_seconds`` (the watch's server-side timeout) the
kind is listed anew. :meth:`Reflector.run` raises on any failure; it runs under the gateway's
supervisor (``llmbatch.background``), which runs it again after a backoff — meanwhile the view
keeps serving what it last held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

Lister = Callable[[], Awaitable[tuple[list[dict[str, Any]], str]]]
"""Every object of the kind and the listing's resourceVersion."""
Watcher = Callable[[str, int], AsyncIterator[tuple[str, dict[str, Any]]]]
"""Events from a resourceVersion until a server-side timeout (seconds)."""

_CHANGES = ("ADDED", "MODIFIED", "DELETED")


class View(Protocol):
    """What a reflector keeps current."""

    def replace(self, objects: list[dict[str, Any]]) -> None: ...

    def apply(self, kind: str, obj: dict[str, Any]) -> None: ...


class Reflector:
    """List + watch of one kind into one :class:`View`."""

    def __init__(self, view: View, lister: Lister, watcher: Watcher, resync_seconds: int) -> None:
        self.view = view
        self.lister = lister
        self.watcher = watcher
        self.resync_seconds = resync_seconds
        self.first_sync = asyncio.Event()
        """Set once the view holds a whole listing."""

    async def run(self) -> None:
        """List, watch until the server ends the watch, list again; forever (raises on a
        failure: its supervisor runs it again)."""
        while True:
            items, version = await self.lister()
            self.view.replace(items)
            self.first_sync.set()
            began = time.monotonic()
            async for kind, obj in self.watcher(version, self.resync_seconds):
                if kind in _CHANGES:
                    self.view.apply(kind, obj)
            if time.monotonic() - began < 1:  # a watch the server ends at once must not spin
                await asyncio.sleep(1)
