"""The tenant namespaces as the gateway sees them: each one's identity, kept by a watch.

A key acts for its namespace only while that namespace exists, is not being deleted and has the
UID the key is bound to (``core.identity``). The gateway checks that on every request against
this view, which a list + watch of the namespaces keeps current (``gateway.reflector``), so a
deleted namespace's keys stop working as soon as the watch shows the deletion — no read per
request, no cache window. Listeners hear of every namespace that went (deleted, being deleted,
or replaced by another of the same name): the listing drops what it held of the old one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from llmbatch.core.identity import NamespaceIdentity


def _ended(held: NamespaceIdentity, now: NamespaceIdentity | None) -> bool:
    """Whether the namespace ``held`` described went, now that its name shows ``now``."""
    return now is None or now.uid != held.uid or (held.live and not now.live)


class Namespaces:
    """Every namespace's identity, by name (a :class:`~llmbatch.gateway.reflector.View`)."""

    def __init__(self) -> None:
        self._by_name: dict[str, NamespaceIdentity] = {}
        self._listeners: list[Callable[[str], None]] = []
        self.synced = asyncio.Event()
        """Set once a whole listing is held: before, every key is refused."""

    def identity(self, name: str) -> NamespaceIdentity | None:
        """The namespace of that name now; None when there is none (or it was not seen)."""
        return self._by_name.get(name)

    def on_gone(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(name)`` whenever the namespace of that name goes."""
        self._listeners.append(listener)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        fresh = {i.name: i for i in map(NamespaceIdentity.of, objects) if i is not None}
        held, self._by_name = self._by_name, fresh
        self.synced.set()
        for name, identity in held.items():
            if _ended(identity, fresh.get(name)):
                self._gone(name)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        identity = NamespaceIdentity.of(obj)
        if identity is None:
            return
        held = self._by_name.get(identity.name)
        if kind == "DELETED":
            if held is not None and held.uid == identity.uid:
                del self._by_name[identity.name]
                self._gone(identity.name)
            return
        self._by_name[identity.name] = identity
        if held is not None and _ended(held, identity):
            self._gone(identity.name)

    def _gone(self, name: str) -> None:
        for listener in self._listeners:
            listener(name)
