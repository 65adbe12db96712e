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
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llmbatch.api.openai import TERMINAL_STATUSES
from llmbatch.core.keys import ANNOTATION_ARCHIVED
from llmbatch.gateway.archive import BatchArchive
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
        if kind == "DELETED" and entry.archived:
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

    def _deleted_here(self, namespace: str, ident: str) -> bool:
        when = self._deleted.get((namespace, ident))
        return when is not None and time.monotonic() - when < PENDING_DELETE_SECONDS

    # --- the loop -----------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"list-cache-{self.kind.plural}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                if self.archive is not None and not self.synced:
                    await self._load_archive()
                version = await self._relist()
                self.first_sync.set()
                backoff = 0.5
                await self._follow(version)
            except asyncio.CancelledError:
                raise
            except WatchExpired as exc:  # the normal way a long quiet watch ends: list again
                log.info("%s watch expired (%s); listing again", self.kind.plural, exc)
            except Exception as exc:  # keep serving the last listing; list again soon
                log.warning(
                    "%s list/watch failed (%s); retrying in %.1fs", self.kind.plural, exc, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)

    async def _load_archive(self) -> None:
        """The archived records, before the first listing (which keeps them: a live object of
        the same id, being archived, replaces its record)."""
        assert self.archive is not None
        for record in await self.archive.load():
            entry = self.kind.entry(record)
            if entry is not None:
                self.index.put(_namespace(record), entry)

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
    """The gateway's two listing caches."""

    batches: ListCache
    files: ListCache

    @classmethod
    def of(
        cls, kube: KubeAPI, resync_seconds: float, archive: BatchArchive | None = None
    ) -> Listings:
        return cls(
            ListCache(kube, BATCHES, resync_seconds, archive=archive),
            ListCache(kube, FILES, resync_seconds),
        )

    @property
    def synced(self) -> bool:
        return self.batches.synced and self.files.synced

    def start(self) -> None:
        self.batches.start()
        self.files.start()

    async def wait_synced(self) -> None:
        await asyncio.gather(self.batches.first_sync.wait(), self.files.first_sync.wait())

    async def stop(self) -> None:
        await asyncio.gather(self.batches.stop(), self.files.stop())
