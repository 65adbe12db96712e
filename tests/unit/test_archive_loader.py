"""The gateway is ready without waiting for the archive, and loads it at scale with read errors
(``gateway.archiveloader``): 400 records with one read in 150 failing used to cost 2,000 reads
and five failed loads while readiness waited; now each record is read once, a failed read once
more, and the gateway is ready meanwhile."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity
from llmbatch.core.workqueue import Backoff
from llmbatch.gateway import archiveloader, metrics
from llmbatch.gateway.app import create_app
from llmbatch.gateway.archive import READ_CONCURRENCY, BatchArchive
from llmbatch.gateway.archiveloader import ArchiveLoader
from llmbatch.gateway.listcache import BATCHES, ListCache
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import StoreError
from tests.fixtures.gateway import GATEWAY_NAMESPACE, FakeKube

TENANTS = ("team-w", "team-x", "team-y", "team-z")


class FlakyArchiveStore(FilesystemStore):
    """A filesystem store whose reads of archive records are counted, fail every
    ``fail_every``-th time (``error``), and wait for ``gate`` when it is given (only for keys
    under ``gated``)."""

    def __init__(
        self,
        root: pathlib.Path,
        fail_every: int = 0,
        error: type[Exception] = StoreError,
        gate: threading.Event | None = None,
        gated: str = keys.ARCHIVE_PREFIX,
    ) -> None:
        super().__init__(root)
        self.fail_every = fail_every
        self.error = error
        self.gate = gate
        self.gated = gated
        self.reads = 0
        self._lock = threading.Lock()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        if key.startswith(keys.ARCHIVE_PREFIX):
            with self._lock:
                self.reads += 1
                count = self.reads
            if self.gate is not None and key.startswith(self.gated):
                assert self.gate.wait(20)
            if self.fail_every and count % self.fail_every == 0:
                raise self.error(f"injected failure of read {count} ({key})")
        return super().get(key, start, end)


def write_records(
    root: pathlib.Path, uids: dict[str, str], per_tenant: int
) -> dict[str, list[str]]:
    """``per_tenant`` archived batches in each namespace of ``uids``; their ids by namespace."""
    store = FilesystemStore(root)
    ids: dict[str, list[str]] = {}
    for t, (namespace, uid) in enumerate(uids.items()):
        for n in range(per_tenant):
            name = f"batch-{t:04x}{n:020x}"
            obj: dict[str, Any] = {
                "apiVersion": "llmbatch.io/v1alpha1",
                "kind": "Batch",
                "metadata": {"name": name, "namespace": namespace, "uid": f"u-{t}-{n}"},
                "spec": {"endpoint": "/v1/chat/completions", "completionWindow": "24h"},
                "status": {"status": "completed", "completedAt": 1},
            }
            batch_id = name.replace("batch-", "batch_", 1)
            store.put(keys.archive_key(namespace, batch_id), archive.encode(
                archive.archive_record(obj, 1, uid)))  # fmt: skip
            ids.setdefault(namespace, []).append(batch_id)
    return ids


def unreadable() -> float:
    sample = metrics.REGISTRY.get_sample_value("llmbatch_gateway_archive_unreadable_records_total")
    return sample or 0.0


def test_the_gateway_is_ready_before_its_archive_and_reads_each_record_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archiveloader, "RETRY_BACKOFF", Backoff(base=0.01, cap=0.01, jitter=0))
    kube = FakeKube()
    uids = {namespace: kube.add_namespace(namespace) for namespace in TENANTS}
    root = tmp_path / "store"
    write_records(root, uids, 100)
    store = FlakyArchiveStore(root, fail_every=150, gate=threading.Event())
    settings = GatewaySettings(
        store_uri=f"file://{root}", gateway_namespace=GATEWAY_NAMESPACE, metrics_port=0
    )
    before = unreadable()
    began = time.monotonic()
    with TestClient(create_app(settings, kube=kube, store=store)) as client:
        # every archive read waits on the gate: the gateway is ready all the same
        assert client.get("/readyz").json() == {"status": "ok"}
        assert time.monotonic() - began < 5
        index = client.app.state.gateway.lists.batches.index  # type: ignore[attr-defined]
        assert len(index) == 0
        assert store.gate is not None
        store.gate.set()
        deadline = time.monotonic() + 20
        while len(index) < 400 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(index) == 400  # the two records skipped at first came in on the retry
        time.sleep(0.2)
    # reads 150 and 300 failed; each of the two was read once more, nothing else twice
    assert store.reads == 402
    assert unreadable() - before == 2


def test_a_tenant_listing_before_the_load_reached_it_gets_its_history_first(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archiveloader, "CHUNK_KEYS", 1)  # one tenant per background chunk
    identities = {n: NamespaceIdentity(n, f"uid-{n}", 0) for n in ("team-a", "team-b")}
    root = tmp_path / "store"
    ids = write_records(root, {n: i.uid for n, i in identities.items()}, 3)
    gate = threading.Event()
    store = FlakyArchiveStore(root, gate=gate, gated=keys.tenant_area("archive", "team-a"))
    reader = BatchArchive(store, identities.get)
    cache = ListCache(FakeKube(), BATCHES, 60, archive=reader)

    async def nothing() -> None:
        return None

    async def scenario() -> None:
        loader = ArchiveLoader(reader, cache, nothing)
        background = asyncio.create_task(loader.run())
        await asyncio.sleep(0.2)  # stuck on team-a's reads
        await asyncio.wait_for(loader.ensure("team-b"), 5)
        page, _ = cache.index.page_after("team-b", None, 10)
        assert sorted(b["id"] for b in page) == sorted(ids["team-b"])
        assert cache.index.page_after("team-a", None, 10)[0] == []
        gate.set()
        await asyncio.wait_for(background, 5)
        await loader.ensure("team-a")
        assert len(cache.index.page_after("team-a", None, 10)[0]) == 3

    asyncio.run(scenario())
    assert store.reads == 6  # team-b's read by the listing, not again by the background


def test_a_load_that_fails_stops_reading(tmp_path: pathlib.Path) -> None:
    identity = NamespaceIdentity("team-a", "uid-a", 0)
    root = tmp_path / "store"
    write_records(root, {identity.name: identity.uid}, 200)
    store = FlakyArchiveStore(root, fail_every=10, error=RuntimeError)
    reader = BatchArchive(store, {identity.name: identity}.get)

    async def scenario() -> None:
        with pytest.raises(ExceptionGroup):
            await reader.read_many(reader.keys())
        failed_at = store.reads
        await asyncio.sleep(0.3)
        assert store.reads == failed_at  # the readers were cancelled: no read after the end

    asyncio.run(scenario())
    # at most the reads in flight when read 10 failed and those started before its failure
    # came back to the loop: not the 200 a load that goes on reading makes
    assert store.reads <= 10 + 2 * READ_CONCURRENCY
