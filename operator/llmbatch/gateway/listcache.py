"""The gateway's listing cache: every Batch and BatchFile, mapped once, kept current by a watch.

``GET /v1/batches`` and ``GET /v1/files`` answer from it (a :class:`~llmbatch.gateway.listindex.
ListIndex` per kind) instead of listing the tenant's objects from the API server per request.
:class:`ListCache` lists a kind in every namespace, then follows a watch from the listing's
resourceVersion; it lists again on 410 Gone, after any watch error (with back-off) and every
resync period, and a watch bounded by a server-side timeout plus a client-side one never hangs.

The gateway's own writes go through at once (:meth:`ListCache.put`, :meth:`ListCache.drop`), so
a client lists what it just created. Two rules keep those and the watch from undoing each other:

- an event older (by resourceVersion) than the entry the cache holds is stale and ignored;
- an object the gateway deleted stays out, whatever a late event or a listing taken before the
  delete says, until the watch reports the delete (or :data:`PENDING_DELETE_SECONDS` pass).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from llmbatch.api.openai import TERMINAL_STATUSES
from llmbatch.background import stop, supervise
from llmbatch.core.keys import ANNOTATION_ARCHIVED
from llmbatch.gateway import metrics
from llmbatch.gateway.archive import BatchArchive
from llmbatch.gateway.archiveloader import ArchiveLoader
from llmbatch.gateway.kube import KubeAPI, WatchExpired
from llmbatch.gateway.listindex import Entry, ListIndex
from llmbatch.gateway.mapping import (
    batch_sort_key,
    batch_to_openai,
    file_sort_key,
    file_to_openai,
)

log = logging.getLogger(__name__)

WATCH_SECONDS = 300
"""Server-side timeout of one watch call; the next one resumes from the last resourceVersion."""
PENDING_DELETE_SECONDS = 300.0
"""How long a delete by this gateway overrides what the API server reports of the object."""
MAP_BATCH = 256
"""Objects mapped between two yields to the event loop while a listing is read: a relist of
10,000 objects must not hold up the requests being served meanwhile."""


@dataclass(frozen=True)
class Kind:
    """A listed kind: its plural and the entry of one of its objects (None: not listed)."""

    plural: str
    entry: Callable[[dict[str, Any]], Entry | None]


def _version(obj: dict[str, Any]) -> int | None:
    raw = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(raw) if raw.isdigit() else None


def batch_entry(obj: dict[str, Any]) -> Entry | None:
    """A Batch (or its archived record) as listed, counting 1 toward its tenant's unfinished
    batches until it finishes; objects not named ``batch-*`` (made by hand) are not listed."""
    meta = obj.get("metadata") or {}
    if not str(meta.get("name") or "").startswith("batch-"):
        return None
    data = batch_to_openai(obj).model_dump(mode="json")
    archived = bool((meta.get("annotations") or {}).get(ANNOTATION_ARCHIVED))
    waiting = int(data["status"] not in TERMINAL_STATUSES)
    return Entry(
        data["id"],
        batch_sort_key(obj),
        data,
        version=_version(obj),
        archived=archived,
        weight=waiting,
    )


def file_entry(obj: dict[str, Any]) -> Entry | None:
    """A BatchFile as listed, in the sub-list of its ``spec.purpose`` (the ``purpose=`` filter),
    counting its bytes toward its tenant's stored bytes."""
    data = file_to_openai(obj).model_dump(mode="json")
    purpose = (obj.get("spec") or {}).get("purpose")
    group = purpose if isinstance(purpose, str) and purpose else None
    return Entry(
        data["id"],
        file_sort_key(obj),
        data,
        group=group,
        version=_version(obj),
        weight=data["bytes"],
    )


BATCHES = Kind("batches", batch_entry)
FILES = Kind("batchfiles", file_entry)


def _namespace(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace") or "")


def _stale(held: Entry | None, version: int | None) -> bool:
    """Whether an event at ``version`` is older than the entry held (unknown: never stale)."""
    if held is None or held.version is None or version is None:
        return False
    return version < held.version


class ListCache:
    """One kind in every namespace, in a :class:`ListIndex`, kept current by list + watch."""

    def __init__(
        self,
        kube: KubeAPI,
        kind: Kind,
        resync_seconds: float,
        watch_seconds: int = WATCH_SECONDS,
        index: ListIndex | None = None,
        archive: BatchArchive | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.resync_seconds = resync_seconds
        self.watch_seconds = watch_seconds
        self.index = index or ListIndex()
        self.archive = archive
        """Where the records of the kind's objects that left the API server are (batches)."""
        self.first_sync = asyncio.Event()
        self.relists = 0
        self._deleted: dict[tuple[str, str], float] = {}  # (namespace, id) → when, by us
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """Listed at least once: from now on the index answers (before, the API server)."""
        return self.first_sync.is_set()

    # --- the gateway's own writes -------------------------------------------------------------

    def put(self, obj: dict[str, Any] | None) -> None:
        """An object the gateway just created or changed (None: nothing came back)."""
        if obj is not None:
            self.apply("MODIFIED", obj)

    def drop(self, obj: dict[str, Any]) -> None:
        """An object the gateway just deleted: gone from the listing at once, and kept out
        until the watch confirms the delete."""
        entry = self.kind.entry(obj)
        if entry is None:
            return
        namespace = _namespace(obj)
        now = time.monotonic()
        self._deleted = {k: t for k, t in self._deleted.items() if now - t < PENDING_DELETE_SECONDS}
        self._deleted[namespace, entry.id] = now
        self.index.remove(namespace, entry.id)

    # --- what the API server reports ----------------------------------------------------------

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (ADDED, MODIFIED, DELETED; others are ignored)."""
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        entry = self.kind.entry(obj)
        if entry is None:
            return
        namespace = _namespace(obj)
        if _stale(self.index.get(namespace, entry.id), entry.version):
            return  # e.g. the watch catching up on a change the gateway wrote through already
        if kind == "DELETED" and entry.archived and self._of_tenant(namespace, obj):
            self.index.put(namespace, entry)  # moved to the archive: still listed
        elif kind == "DELETED":
            self._deleted.pop((namespace, entry.id), None)
            self.index.remove(namespace, entry.id)
        elif not self._deleted_here(namespace, entry.id):
            self.index.put(namespace, entry)

    def replace(self, listed: list[tuple[str, Entry]], version: str) -> None:
        """The index from a fresh listing taken at ``version``.

        A write through the gateway after the listing's snapshot (its entry is newer) is kept,
        and so is a delete by the gateway the watch has not confirmed yet.
        """
        at = int(version) if version.isdigit() else None
        fresh: dict[tuple[str, str], Entry] = {}
        for namespace, entry in listed:
            if not self._deleted_here(namespace, entry.id):
                fresh[namespace, entry.id] = entry
        for namespace, held in self.index.items():
            newer = at is not None and held.version is not None and held.version > at
            if newer or (held.archived and (namespace, held.id) not in fresh):
                fresh[namespace, held.id] = held
        self.index.replace((namespace, entry) for (namespace, _), entry in fresh.items())

    def adopt_archived(self, namespace: str, record: dict[str, Any]) -> None:
        """An archived record read from the store (``gateway.archiveloader``): listed unless
        the index holds its batch already (its live object, as new or newer) or the gateway
        deleted it."""
        entry = self.kind.entry(record)
        if entry is None or self.index.get(namespace, entry.id) is not None:
            return
        if not self._deleted_here(namespace, entry.id):
            self.index.put(namespace, entry)

    def forget_archived(self, namespace: str) -> None:
        """The namespace of that name went: what the archive gave its listing goes too (a later
        namespace of the same name never sees it; its live objects go with their watch events)."""
        for held_namespace, entry in list(self.index.items()):
            if held_namespace == namespace and entry.archived:
                self.index.remove(namespace, entry.id)

    def _of_tenant(self, namespace: str, obj: dict[str, Any]) -> bool:
        """Whether an object is of the namespace of that name now (``core.identity``)."""
        return self.archive is None or self.archive.belongs(namespace, obj)

    def _deleted_here(self, namespace: str, ident: str) -> bool:
        when = self._deleted.get((namespace, ident))
        return when is not None and time.monotonic() - when < PENDING_DELETE_SECONDS

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = supervise(f"list-{self.kind.plural}", self.run, metrics.TASK_RESTARTS)

    async def stop(self) -> None:
        await stop(self._task)

    async def run(self) -> None:
        """List, follow the watch, list again, forever; a failure raises (the supervisor runs
        it again after a backoff, the index serving the last listing meanwhile)."""
        while True:
            try:
                version = await self._relist()
                self.first_sync.set()
                await self._follow(version)
            except WatchExpired as exc:  # the normal way a long quiet watch ends: list again
                log.info("%s watch expired (%s); listing again", self.kind.plural, exc)

    async def _recover_archived(self, listed: list[tuple[str, Entry]]) -> None:
        """Finished entries the listing no longer has and whose move to the archive this
        cache did not see (a watch gap): their records come back from the store."""
        if self.archive is None:
            return
        present = {(namespace, entry.id) for namespace, entry in listed}
        for namespace, held in list(self.index.items()):
            finished = held.data.get("status") in TERMINAL_STATUSES
            if not held.archived and finished and (namespace, held.id) not in present:
                record = await self.archive.get(namespace, held.id)
                entry = self.kind.entry(record) if record is not None else None
                if entry is not None:
                    self.index.put(namespace, entry)

    async def _relist(self) -> str:
        """List the kind page by page, mapping as the pages come; the listing's version."""
        listed: list[tuple[str, Entry]] = []
        version = ""
        async for items, listed_at in self.kube.list_cluster_pages(self.kind.plural):
            version = listed_at
            for start in range(0, len(items), MAP_BATCH):
                for obj in items[start : start + MAP_BATCH]:
                    entry = self.kind.entry(obj)
                    if entry is not None:
                        listed.append((_namespace(obj), entry))
                await asyncio.sleep(0)
        await self._recover_archived(listed)
        self.replace(listed, version)
        self.relists += 1
        return version

    async def _follow(self, version: str) -> None:
        """Apply watch events from ``version`` on, a watch after another, until resync is due."""
        deadline = time.monotonic() + self.resync_seconds
        while (left := deadline - time.monotonic()) > 0:
            began = time.monotonic()
            timeout = max(1, int(min(left, self.watch_seconds)))
            async for kind, obj in self.kube.watch_cluster(self.kind.plural, version, timeout):
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                self.apply(kind, obj)
            if time.monotonic() - began < 1:  # a watch the server ends at once must not spin
                await asyncio.sleep(1)


@dataclass
class Listings:
    """The gateway's two listing caches, and the archive's records in the batches' one."""

    batches: ListCache
    files: ListCache
    archived: ArchiveLoader | None = None
    """Puts the archived records into ``batches`` (None: no archive)."""
    _loader: asyncio.Task[None] | None = field(default=None, init=False)

    @classmethod
    def of(
        cls,
        kube: KubeAPI,
        resync_seconds: float,
        archive: BatchArchive | None = None,
        tenants_known: Callable[[], Awaitable[Any]] | None = None,
    ) -> Listings:
        """The caches; with an archive, its loader, which waits for ``tenants_known``."""
        batches = ListCache(kube, BATCHES, resync_seconds, archive=archive)
        loader = None
        if archive is not None:
            loader = ArchiveLoader(archive, batches, tenants_known or _nothing_to_wait_for)
        return cls(batches, ListCache(kube, FILES, resync_seconds), loader)

    @property
    def synced(self) -> bool:
        return self.batches.synced and self.files.synced

    def start(self) -> None:
        self.batches.start()
        self.files.start()
        if self.archived is not None:
            self._loader = supervise("archive-loader", self.archived.run, metrics.TASK_RESTARTS)

    async def wait_synced(self) -> None:
        await asyncio.gather(self.batches.first_sync.wait(), self.files.first_sync.wait())

    async def ensure_archived(self, namespace: str) -> None:
        """Return once ``namespace``'s archived batches are in its listing."""
        if self.archived is not None:
            await self.archived.ensure(namespace)

    def forget(self, namespace: str) -> None:
        """The namespace of that name went (``gateway.namespaces``)."""
        self.batches.forget_archived(namespace)

    async def stop(self) -> None:
        await stop(self._loader)
        if self.archived is not None:
            await self.archived.stop()
        await asyncio.gather(self.batches.stop(), self.files.stop())


async def _nothing_to_wait_for() -> None:
    return None
