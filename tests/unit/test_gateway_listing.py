"""Listing from the watch-fed cache (llmbatch.gateway.listcache): the cache on FakeKube's watch
(events, stale ones, the gateway's own writes, a relist after 410 Gone and on resync)."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from llmbatch.gateway.listcache import BATCHES, FILES, ListCache, batch_entry, file_entry
from llmbatch.gateway.mapping import ANNOTATION_CREATED_NS
from tests.fixtures.gateway import FakeKube

NS = "team-l"


def batch_obj(n: int, namespace: str = NS, created_ns: int | None = None) -> dict[str, Any]:
    annotations = {} if created_ns is None else {ANNOTATION_CREATED_NS: str(created_ns)}
    return {
        "metadata": {"name": f"batch-b{n:04d}", "namespace": namespace, "annotations": annotations},
        "spec": {"endpoint": "/v1/chat/completions", "inputFileID": "", "completionWindow": "24h"},
    }


def file_obj(n: int, purpose: str = "batch", namespace: str = NS) -> dict[str, Any]:
    file_id = f"file-{n:032x}"
    return {
        "metadata": {"name": file_id, "namespace": namespace, "annotations": {}},
        "spec": {"id": file_id, "bytes": 1, "purpose": purpose, "createdAt": 1_700_000_000 + n},
    }


def bid(n: int) -> str:
    return f"batch_b{n:04d}"


def fid(n: int) -> str:
    return f"file-{n:032x}"


def listed(cache: ListCache, namespace: str = NS, **kwargs: Any) -> list[str]:
    page, _ = cache.index.page_after(namespace, kwargs.pop("after", None), 100, **kwargs)
    return [str(item["id"]) for item in page]


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def run(scenario: Callable[[FakeKube], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(FakeKube()), timeout=30))


@asynccontextmanager
async def following(kube: FakeKube, resync: float = 60) -> AsyncIterator[ListCache]:
    """A batches cache following ``kube``, synced."""
    cache = ListCache(kube, BATCHES, resync_seconds=resync, watch_seconds=30)
    cache.start()
    try:
        await asyncio.wait_for(cache.first_sync.wait(), 5)
        yield cache
    finally:
        await cache.stop()


# --- the cache on the fake watch ----------------------------------------------------------------


def test_watch_events_add_change_and_delete() -> None:
    async def scenario(kube: FakeKube) -> None:
        await kube.create("batches", NS, batch_obj(1, created_ns=10))
        async with following(kube) as cache:
            assert listed(cache) == [bid(1)]
            await kube.create("batches", NS, batch_obj(2, created_ns=20))
            await kube.create("batches", "team-other", batch_obj(3, "team-other", created_ns=30))
            await eventually(lambda: listed(cache) == [bid(2), bid(1)])
            assert listed(cache, "team-other") == [bid(3)]
            await kube.patch("batches", NS, "batch-b0001", {"status": {"status": "completed"}})
            await eventually(lambda: cache.index.get(NS, bid(1)).data["status"] == "completed")
            await kube.delete("batches", NS, "batch-b0002")
            await eventually(lambda: listed(cache) == [bid(1)])
            assert listed(cache, after=bid(2)) == [bid(1)]  # deleted while watched: a cursor
            assert kube.calls["list-cluster batches"] == 1  # events, not listings

    run(scenario)


def test_a_watch_410_gone_lists_again_and_catches_up() -> None:
    async def scenario(kube: FakeKube) -> None:
        for n in (1, 2):
            await kube.create("batches", NS, batch_obj(n, created_ns=n))
        async with following(kube) as cache:
            # While the watch is away the API server changes and forgets its history: the
            # changes are never seen as events, the resumed watch meets 410.
            del kube.objects["batches", NS, "batch-b0001"]
            kube.objects["batches", NS, "batch-b0007"] = batch_obj(7, created_ns=7)
            kube.compact()
            await eventually(lambda: cache.relists == 2)
            assert listed(cache) == [bid(7), bid(2)]
            assert listed(cache, after=bid(1)) == []  # gone without an event: still a cursor
            await kube.create("batches", NS, batch_obj(8, created_ns=8))  # and the watch goes on
            await eventually(lambda: listed(cache) == [bid(8), bid(7), bid(2)])

    run(scenario)


def test_the_resync_period_lists_again() -> None:
    async def scenario(kube: FakeKube) -> None:
        async with following(kube, resync=1) as cache:
            kube.objects["batches", NS, "batch-b0001"] = batch_obj(1)  # an event never sent
            await eventually(lambda: listed(cache) == [bid(1)], timeout=10)
            assert cache.relists >= 2

    run(scenario)


def test_a_failing_listing_is_retried() -> None:
    class Flaky(FakeKube):
        failures = 2

        async def list_cluster_pages(
            self, plural: str, page_size: int = 2
        ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("API server unavailable")
            async for page in super().list_cluster_pages(plural, page_size):
                yield page

    async def scenario() -> None:
        kube = Flaky()
        await kube.create("batches", NS, batch_obj(1))
        cache = ListCache(kube, BATCHES, resync_seconds=60)
        cache.start()
        assert not cache.synced
        await asyncio.wait_for(cache.first_sync.wait(), 10)
        assert listed(cache) == [bid(1)]
        await cache.stop()

    asyncio.run(scenario())


def test_a_stale_event_does_not_undo_a_newer_write_through() -> None:
    cache = ListCache(FakeKube(), BATCHES, resync_seconds=60)
    old = {**batch_obj(1), "metadata": {**batch_obj(1)["metadata"], "resourceVersion": "5"}}
    new = copy.deepcopy(old)
    new["metadata"]["resourceVersion"] = "6"
    new["spec"]["cancel"] = True
    cache.put(new)  # the answer of the gateway's own cancel
    cache.apply("MODIFIED", old)  # the watch, catching up on a change before it
    assert cache.index.get(NS, bid(1)).data["status"] == "cancelling"
    cache.apply("DELETED", old)  # a delete of an older incarnation of the name
    assert cache.index.get(NS, bid(1)) is not None
    cache.apply("MODIFIED", {**new, "metadata": {**new["metadata"], "resourceVersion": "9"}})
    cache.apply("DELETED", {**new, "metadata": {**new["metadata"], "resourceVersion": "10"}})
    assert cache.index.get(NS, bid(1)) is None


def test_a_delete_here_holds_until_the_watch_confirms_it() -> None:
    cache = ListCache(FakeKube(), FILES, resync_seconds=60)
    obj = file_obj(1)
    obj["metadata"]["resourceVersion"] = "3"
    cache.put(obj)
    cache.drop(obj)  # DELETE /v1/files/{id}
    assert listed(cache) == []
    late = copy.deepcopy(obj)
    late["metadata"]["resourceVersion"] = "4"  # a change made just before the delete
    cache.apply("MODIFIED", late)
    assert listed(cache) == []
    entry = file_entry(late)
    assert entry is not None
    cache.replace([(NS, entry)], "4")  # a listing taken before the delete
    assert listed(cache) == []
    assert listed(cache, after=fid(1)) == []  # its cursor still works
    cache.apply("DELETED", late)  # confirmed: the id may come back (it never does for files)
    cache.apply("ADDED", late)
    assert listed(cache) == [fid(1)]


def test_a_relist_keeps_writes_through_newer_than_its_snapshot() -> None:
    cache = ListCache(FakeKube(), BATCHES, resync_seconds=60)
    listed_obj = batch_obj(1, created_ns=1)
    listed_obj["metadata"]["resourceVersion"] = "10"
    created = batch_obj(2, created_ns=2)
    created["metadata"]["resourceVersion"] = "12"
    cache.put(created)  # created after the listing's snapshot, its ADDED not seen yet
    gone = batch_obj(3, created_ns=3)
    gone["metadata"]["resourceVersion"] = "8"
    cache.put(gone)  # older than the snapshot and not in it: deleted meanwhile
    entry = batch_entry(listed_obj)
    assert entry is not None
    cache.replace([(NS, entry)], "11")
    assert listed(cache) == [bid(2), bid(1)]


def test_hand_made_batches_are_not_listed_and_files_are_grouped_by_purpose() -> None:
    hand_made = batch_obj(1)
    hand_made["metadata"]["name"] = "nightly-run"
    assert batch_entry(hand_made) is None
    entry = file_entry(file_obj(1, purpose="batch_output"))
    assert entry is not None
    assert (entry.id, entry.group, entry.data["purpose"]) == (
        fid(1),
        "batch_output",
        "batch_output",
    )
