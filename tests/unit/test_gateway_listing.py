"""Listing from the watch-fed cache (llmbatch.gateway.listcache): the cache on FakeKube's watch
(events, stale ones, the gateway's own writes, a relist after 410 Gone and on resync), and
``GET /v1/batches`` / ``GET /v1/files`` end to end (pages, cursors, no API listing once synced)."""

from __future__ import annotations

import asyncio
import copy
import json
import pathlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest

from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity
from llmbatch.core.ids import batch_id_from_name
from llmbatch.gateway import app as gateway_app
from llmbatch.gateway.archive import BatchArchive
from llmbatch.gateway.listcache import (
    BATCHES,
    FILES,
    ListCache,
    Listings,
    batch_entry,
    file_entry,
)
from llmbatch.gateway.mapping import ANNOTATION_CREATED_NS
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.storage import FilesystemStore
from tests.fixtures.gateway import GATEWAY_NAMESPACE, FakeGateway, FakeKube, auth

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


# --- archived batches: still listed once their object left the API server -------------------


TENANT = NamespaceIdentity(NS, "uid-" + NS, created_at=0)


def archived_store(tmp_path: pathlib.Path, *objs: dict[str, Any]) -> BatchArchive:
    store = FilesystemStore(tmp_path / "store")
    for obj in objs:
        meta = obj["metadata"]
        record = archive.archive_record(obj, 1, TENANT.uid)
        key = keys.archive_key(meta["namespace"], batch_id_from_name(meta["name"]))
        store.put(key, archive.encode(record))
    return BatchArchive(store, {NS: TENANT}.get)


@asynccontextmanager
async def listing_with(kube: FakeKube, store: BatchArchive) -> AsyncIterator[Listings]:
    """Both listing caches with the archive's loader, synced and the archive loaded."""
    lists = Listings.of(kube, 60, store)
    lists.batches.watch_seconds = 30
    lists.start()
    try:
        await asyncio.wait_for(lists.wait_synced(), 5)
        assert lists.archived is not None
        await asyncio.wait_for(lists.archived.done.wait(), 5)
        yield lists
    finally:
        await lists.stop()


def finished_obj(n: int, created_ns: int) -> dict[str, Any]:
    obj = batch_obj(n, created_ns=created_ns)
    obj["metadata"]["uid"] = f"uid-{n}"
    obj["status"] = {"status": "completed", "completedAt": 1}
    return obj


def test_archived_batches_are_listed_from_the_start_and_when_their_object_goes(
    tmp_path: pathlib.Path,
) -> None:
    async def scenario(kube: FakeKube) -> None:
        old = finished_obj(1, created_ns=1)
        moving = finished_obj(2, created_ns=2)
        store = archived_store(tmp_path, old)
        await kube.create("batches", NS, moving)
        await kube.create("batches", NS, batch_obj(3, created_ns=3))
        async with listing_with(kube, store) as lists:
            cache = lists.batches
            assert listed(cache) == [bid(3), bid(2), bid(1)]  # the record, in its place
            # retention moves batch 2: record, annotation, delete (the watch sees the last two)
            archived_store(tmp_path, moving)
            key = keys.archive_key(NS, bid(2))
            annotated = {"metadata": {"annotations": {keys.ANNOTATION_ARCHIVED: key}}}
            await kube.patch("batches", NS, "batch-b0002", annotated)
            await kube.delete("batches", NS, "batch-b0002")
            await kube.delete("batches", NS, "batch-b0003")  # deleted by hand: gone
            await eventually(lambda: listed(cache) == [bid(2), bid(1)])
            kube.compact()  # and a relist keeps both records
            await eventually(lambda: cache.relists == 2)
            assert listed(cache) == [bid(2), bid(1)]

    run(scenario)


def test_a_relist_finds_in_the_archive_a_finished_batch_whose_move_it_missed(
    tmp_path: pathlib.Path,
) -> None:
    async def scenario(kube: FakeKube) -> None:
        moved = finished_obj(1, created_ns=1)
        await kube.create("batches", NS, moved)
        store = archived_store(tmp_path)
        cache = ListCache(kube, BATCHES, resync_seconds=60, watch_seconds=30, archive=store)
        cache.start()
        try:
            await asyncio.wait_for(cache.first_sync.wait(), 5)
            assert listed(cache) == [bid(1)]
            # moved while the watch was away: neither the annotation nor the delete was seen
            archived_store(tmp_path, moved)
            del kube.objects["batches", NS, "batch-b0001"]
            kube.compact()
            await eventually(lambda: cache.relists == 2)
            assert listed(cache) == [bid(1)]
        finally:
            await cache.stop()

    run(scenario)


def test_retrieve_answers_for_an_archived_batch(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    obj = finished_obj(1, created_ns=1)
    store = FilesystemStore(fake_gateway.store_root)
    record = archive.archive_record(obj, 1, fake_gateway.kube.namespace_meta[NS]["uid"])
    store.put(keys.archive_key(NS, bid(1)), archive.encode(record))
    got = fake_gateway.client.get(f"/v1/batches/{bid(1)}", headers=auth(key))
    assert got.status_code == 200, got.text
    assert got.json()["status"] == "completed"
    other = fake_gateway.key("team-z")
    assert fake_gateway.client.get(f"/v1/batches/{bid(1)}", headers=auth(other)).status_code == 404
    cancel = fake_gateway.client.post(f"/v1/batches/{bid(1)}/cancel", headers=auth(key))
    assert cancel.status_code == 409


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


# --- the routes -------------------------------------------------------------------------------


def _line(i: int) -> bytes:
    row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**row, "body": {"model": "m", "max_tokens": 4}}).encode() + b"\n"


def upload(gw: FakeGateway, key: str) -> str:
    resp = gw.client.post(
        "/v1/files",
        headers=auth(key),
        files={"file": ("r.jsonl", _line(1))},
        data={"purpose": "batch"},
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def create(gw: FakeGateway, key: str, file_id: str) -> str:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    resp = gw.client.post("/v1/batches", headers=auth(key), json=body)
    assert resp.status_code == 200, resp.text
    return str(resp.json()["id"])


def get(gw: FakeGateway, key: str, path: str, **params: Any) -> Any:
    return gw.client.get(path, headers=auth(key), params=params)


def walk_ids(gw: FakeGateway, key: str, path: str, limit: int, **params: Any) -> list[str]:
    seen: list[str] = []
    for _ in range(100):
        page = get(gw, key, path, limit=limit, **({"after": seen[-1]} if seen else {}), **params)
        assert page.status_code == 200, page.text
        body = page.json()
        seen += [item["id"] for item in body["data"]]
        if not body["has_more"]:
            return seen
    raise AssertionError("pages never ended")


def wait_until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_listing_once_synced_asks_the_api_server_nothing(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key = fake_gateway.key(NS)
    file_id = upload(fake_gateway, key)
    created = [create(fake_gateway, key, file_id) for _ in range(5)]
    before = dict(fake_gateway.kube.calls)
    assert walk_ids(fake_gateway, key, "/v1/batches", 2) == created[::-1]
    assert walk_ids(fake_gateway, key, "/v1/files", 1) == [file_id]
    assert dict(fake_gateway.kube.calls) == before  # no listing, no new watch


def test_the_envelope_is_the_one_the_api_listing_gave(fake_gateway: FakeGateway) -> None:
    """The cache's pages equal, byte for byte, the pages listed from the API server (the way
    before the cache), including objects with and without the nanosecond annotation."""
    key = fake_gateway.key(NS)
    portal = fake_gateway.client.portal
    second = 1_795_953_600
    for n in range(9):
        stamp = None if n % 3 == 0 else second * 10**9 + (n % 2)  # ties broken by name
        portal.call(fake_gateway.kube.create, "batches", NS, batch_obj(n, created_ns=stamp))
    hand_made = batch_obj(99)
    hand_made["metadata"]["name"] = "nightly-run"
    portal.call(fake_gateway.kube.create, "batches", NS, hand_made)
    lists = fake_gateway.client.app.state.gateway.lists
    wait_until(lambda: lists.batches.index.get(NS, bid(8)) is not None)

    def pages() -> list[Any]:
        return [
            get(fake_gateway, key, "/v1/batches", limit=4, **cursor).content
            for cursor in ({}, {"after": bid(3)}, {"after": bid(0)})
        ]

    cached = pages()
    lists.batches.first_sync.clear()  # as before the first sync: from the API server
    listed_by_api = pages()
    lists.batches.first_sync.set()
    assert fake_gateway.kube.calls["list batches"] == 3
    assert cached == listed_by_api
    assert len(json.loads(cached[0])["data"]) == 4


def test_a_deleted_after_keeps_paging(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    files = [upload(fake_gateway, key) for _ in range(5)]
    newest = files[::-1]
    first = get(fake_gateway, key, "/v1/files", limit=2).json()
    assert [f["id"] for f in first["data"]] == newest[:2]
    # the client deletes what it read; the SDK asks for the next page after the deleted id
    assert (
        fake_gateway.client.delete(f"/v1/files/{first['last_id']}", headers=auth(key)).status_code
        == 200
    )
    second = get(fake_gateway, key, "/v1/files", limit=2, after=first["last_id"]).json()
    assert [f["id"] for f in second["data"]] == newest[2:4]
    assert second["has_more"] is True
    # retention (the operator) deletes one: the watch reports it, the cursor still pages on
    fake_gateway.client.portal.call(fake_gateway.kube.delete, "batchfiles", NS, newest[3])
    lists = fake_gateway.client.app.state.gateway.lists
    wait_until(lambda: lists.files.index.get(NS, newest[3]) is None)
    third = get(fake_gateway, key, "/v1/files", limit=2, after=newest[3]).json()
    assert ([f["id"] for f in third["data"]], third["has_more"]) == ([newest[4]], False)
    asc = get(fake_gateway, key, "/v1/files", order="asc", after=newest[1]).json()
    assert [f["id"] for f in asc["data"]] == [newest[0]]


def test_unknown_and_other_tenants_cursors_are_400(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key, other = fake_gateway.key(NS), fake_gateway.key("team-other")
    file_id = upload(fake_gateway, key)
    batch_id = create(fake_gateway, key, file_id)
    upload(fake_gateway, other)
    for path, cursor in (
        ("/v1/batches", batch_id),
        ("/v1/files", file_id),
        ("/v1/batches", "batch_" + "0" * 24),
        ("/v1/files", "file-" + "0" * 32),
    ):
        caller = other if cursor in (batch_id, file_id) else key
        resp = get(fake_gateway, caller, path, after=cursor)
        assert resp.status_code == 400, (path, cursor)
        assert resp.json()["error"]["param"] == "after"
    assert fake_gateway.client.delete(f"/v1/files/{file_id}", headers=auth(key)).status_code == 200
    resp = get(fake_gateway, other, "/v1/files", after=file_id)  # deleted: still not theirs
    assert resp.status_code == 400
    assert get(fake_gateway, key, "/v1/batches", limit=101).status_code == 400
    assert get(fake_gateway, key, "/v1/batches", limit=0).status_code == 400


def test_files_the_operator_writes_are_listed_by_purpose(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    uploaded = upload(fake_gateway, key)
    output = file_obj(7, purpose="batch_output")
    fake_gateway.client.portal.call(fake_gateway.kube.create, "batchfiles", NS, output)
    lists = fake_gateway.client.app.state.gateway.lists
    wait_until(lambda: lists.files.index.get(NS, fid(7)) is not None)
    outputs = get(fake_gateway, key, "/v1/files", purpose="batch_output").json()
    assert [f["id"] for f in outputs["data"]] == [fid(7)]
    inputs = get(fake_gateway, key, "/v1/files", purpose="batch").json()
    assert [f["id"] for f in inputs["data"]] == [uploaded]
    everything = get(fake_gateway, key, "/v1/files", order="asc").json()
    assert [f["id"] for f in everything["data"]] == [fid(7), uploaded]  # created 2023: older


class DeafKube(FakeKube):
    """A watch that never reports anything: only the gateway's own writes reach the cache."""

    async def watch_cluster(
        self, plural: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        await asyncio.sleep(timeout_seconds)
        for event in ():
            yield event


class GatedKube(FakeKube):
    """A first listing that waits for the test to open the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    async def list_cluster_pages(
        self, plural: str, page_size: int = 2
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        while not self.gate.is_set():
            await asyncio.sleep(0.01)
        async for page in super().list_cluster_pages(plural, page_size):
            yield page


@contextmanager
def serving(tmp_path: pathlib.Path, kube: FakeKube) -> Iterator[FakeGateway]:
    from starlette.testclient import TestClient

    from llmbatch.storage import open_store

    root = tmp_path / "store"
    cfg = GatewaySettings(
        store_uri=f"file://{root}", gateway_namespace=GATEWAY_NAMESPACE, metrics_port=0
    )
    app = gateway_app.create_app(cfg, kube=kube, store=open_store(cfg.store_uri))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield FakeGateway(kube, root, client)


def test_the_gateways_own_writes_are_listed_at_once(tmp_path: pathlib.Path) -> None:
    with serving(tmp_path, DeafKube()) as gw:
        gw.serve("m")
        key = gw.key(NS)
        file_id = upload(gw, key)
        batch_id = create(gw, key, file_id)
        assert [b["id"] for b in get(gw, key, "/v1/batches").json()["data"]] == [batch_id]
        assert [f["id"] for f in get(gw, key, "/v1/files").json()["data"]] == [file_id]
        gw.client.post(f"/v1/batches/{batch_id}/cancel", headers=auth(key))
        assert get(gw, key, "/v1/batches").json()["data"][0]["status"] == "cancelling"
        gw.client.delete(f"/v1/files/{file_id}", headers=auth(key))
        assert get(gw, key, "/v1/files").json()["data"] == []
        assert gw.kube.calls["list batches"] == gw.kube.calls["list batchfiles"] == 0


def test_before_the_first_sync_the_api_server_answers_and_readyz_waits(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_app, "FIRST_SYNC_WAIT_SECONDS", 0.1)
    kube = GatedKube()
    with serving(tmp_path, kube) as gw:
        key = gw.key(NS)  # the keys are loaded, the lists not yet
        assert gw.client.get("/readyz").json() == {"status": "lists not synced"}
        file_id = upload(gw, key)
        assert [f["id"] for f in get(gw, key, "/v1/files").json()["data"]] == [file_id]
        assert get(gw, key, "/v1/files", after="file-" + "0" * 32).status_code == 400
        # the upload counted the tenant's stored bytes from a listing too (its storage cap)
        assert kube.calls["list batchfiles"] == 3
        kube.gate.set()
        wait_until(lambda: gw.client.get("/readyz").status_code == 200)
        assert [f["id"] for f in get(gw, key, "/v1/files").json()["data"]] == [file_id]
        assert kube.calls["list batchfiles"] == 3
