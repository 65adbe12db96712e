"""Read → change → write back with the resourceVersion read, until the write sticks.

The one optimistic-concurrency loop of the project (in the spirit of Kueue's
``clientutil.Patch``): the gateway's and the operator's credit updates both go through it, so a
concurrent writer never overwrites another's change — a 409 starts over from a fresh read.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any, Protocol

from llmbatch.kube.client import Conflict

ATTEMPTS = 30

StatusChange = Callable[[dict[str, Any]], dict[str, Any] | None]
"""Given the object read, its new status (camelCase), or None for "nothing to change"."""


class Contended(RuntimeError):
    """The object kept changing for every attempt; the caller retries later."""


class StatusWriter(Protocol):
    async def get_custom(
        self, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None: ...

    async def replace_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> Any: ...


async def update_status(
    kube: StatusWriter,
    plural: str,
    namespace: str,
    name: str,
    change: StatusChange,
    *,
    attempts: int = ATTEMPTS,
) -> dict[str, Any] | None:
    """Apply ``change`` to the object's status until the write sticks.

    Returns the status written; None when the object does not exist (or is gone before the
    write) or ``change`` wants no change. Exceptions ``change`` raises end the loop unchanged.
    :class:`Contended` after ``attempts`` conflicting writes.
    """
    for attempt in range(attempts):
        obj = await kube.get_custom(plural, namespace, name)
        if obj is None:
            return None
        status = change(obj)
        if status is None:
            return None
        try:
            if not await kube.replace_custom_status(
                plural, namespace, name, {**obj, "status": status}
            ):
                return None
        except Conflict:
            await asyncio.sleep(random.uniform(0, 0.01 * min(attempt + 1, 10)))
            continue
        return status
    raise Contended(f"{plural}/{name} in {namespace} kept changing; retry later")
