"""Read → change → write back with the resourceVersion read, until the write sticks; and the
status a merge patch makes (:func:`merged`, :func:`status_replacement`).

The one optimistic-concurrency loop of the project (in the spirit of Kueue's
``clientutil.Patch``): the gateway's and the operator's credit updates both go through it, so a
concurrent writer never overwrites another's change — a 409 starts over from a fresh read.
"""

from __future__ import annotations

import asyncio
import copy
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


def merged(target: Any, patch: Any) -> Any:
    """``target`` with the RFC 7386 JSON merge ``patch`` applied (neither is changed).

    A ``None`` member of the patch removes that member; an object merges member by member;
    anything else (lists, scalars, an object over a non-object) replaces what was there."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merged(result.get(name), value)
    return result


def status_replacement(
    obj: dict[str, Any], patch: dict[str, Any], *, api_version: str, kind: str
) -> dict[str, Any]:
    """The body of a status PUT that writes what the merge patch ``{"status": patch}`` of
    ``obj`` (an ``api_version`` ``kind``) would, with ``obj``'s resourceVersion as
    precondition.

    The status subresource of a custom resource keeps the stored metadata and spec whatever
    the body says (its strategy resets both), so the body carries only the object's identity
    and the merged status: no copy of a large spec crosses the wire, and the API server skips
    decoding and applying a patch."""
    meta = obj["metadata"]
    identity = {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": identity,
        "status": merged(obj.get("status") or {}, patch),
    }
