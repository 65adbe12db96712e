"""The pool rounds' index of running batches: seeded by one listing, then fed by the watch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from llmbatch.controller.runningindex import RunningIndex


def batch(uid: str, namespace: str, phase: str | None, pool: str | None = "p") -> dict[str, Any]:
    status = {"status": phase, "pool": pool} if phase else {}
    return {"metadata": {"uid": uid, "namespace": namespace, "name": uid}, "status": status}


async def listing(*items: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    for item in items:
        yield item


def test_seeded_by_one_listing_of_the_served_namespaces() -> None:
    index = RunningIndex()
    seen = asyncio.run(
        index.seed(
            listing(
                batch("a", "t1", "in_progress"),
                batch("b", "t1", "validating"),
                batch("c", "other", "in_progress"),
                batch("d", "t1", "in_progress", pool="q"),
            ),
            served=lambda ns: ns == "t1",
        )
    )
    assert seen == 3
    assert [b["metadata"]["uid"] for b in index.get("p")] == ["a"]
    assert [b["metadata"]["uid"] for b in index.get("q")] == ["d"]


def test_the_watch_moves_ends_and_deletes_entries() -> None:
    index = RunningIndex()
    index.notice(batch("a", "t1", "in_progress"))
    index.notice(batch("a", "t1", "in_progress", pool="q"))  # moved (a pool edit)
    assert index.get("p") == []
    assert [b["metadata"]["uid"] for b in index.get("q")] == ["a"]
    index.notice(batch("a", "t1", "completed", pool="q"))
    assert index.get("q") == []
    index.notice(batch("b", "t1", "in_progress"))
    index.notice(batch("b", "t1", "in_progress"), deleted=True)
    assert index.get("p") == []
