"""Read → change → write back with the resourceVersion read, until the write sticks.

The one optimistic-concurrency loop of the project (in the spirit of Kueue's
``clientutil.Patch``): the gateway's and the operator's credit updates both go through it, so a
concurrent writer never overwrites another's change — a 409 starts over from a fresh read.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

from llmbatch.kube.client import Conflict

ATTEMPTS = 30

StatusChange = Callable[[dict[str, Any]], dict[str, Any] | None]
"""Given the object read, its new status (camelCase), or None for "nothing to change"."""


class Contended(RuntimeError):
    """The object kept changing for every attempt; the caller retries later."""


Read = Callable[[], Awaitable[dict[str, Any] | None]]
"""Reads the object (None: it does not exist)."""
Write = Callable[[dict[str, Any]], Awaitable[Any]]
"""PUTs the object's status subresource with its resourceVersion as precondition: raises
:class:`Conflict` when it changed since it was read, returns something falsy when it is gone."""


async def update_status(
    read: Read, write: Write, change: StatusChange, *, attempts: int = ATTEMPTS
) -> dict[str, Any] | None:
    """Apply ``change`` to the object's status until the write sticks.

    Returns the status written; None when the object does not exist (or is gone before the
    write) or ``change`` wants no change. Exceptions ``change`` raises end the loop unchanged.
    :class:`Contended` after ``attempts`` conflicting writes.
    """
    for attempt in range(attempts):
        obj = await read()
        if obj is None:
            return None
        status = change(obj)
        if status is None:
            return None
        try:
            if not await write({**obj, "status": status}):
                return None
        except Conflict:
            await asyncio.sleep(random.uniform(0, 0.01 * min(attempt + 1, 10)))
            continue
        return status
    raise Contended("the object kept changing; retry later")
