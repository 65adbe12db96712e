"""Archived batches into the listing, without holding up the gateway's start.

The listing shows a tenant's archived batches beside its live ones (``gateway.archive``). With
thousands of records, reading them all before the gateway was ready kept it unready for as long
as the store took, and one read error started the whole load over while the failed one kept
reading. Now the gateway is ready once the live objects are listed, and :class:`ArchiveLoader`

- reads every tenant's records in the background (:meth:`run`, a supervised task);
- reads one tenant's records first when that tenant lists its batches before the background
  load reached it (:meth:`ensure`), so a listing is never missing history;
- skips a record it cannot read and counts it (``llmbatch_gateway_archive_unreadable_records_
  total``), then reads the skipped ones again after a backoff, up to :data:`RETRY_PASSES` times
  (``GET /v1/batches/{id}`` reads a record itself, so a skipped one is still answered);
- never reads a record twice when nothing failed, and stops reading when it is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from llmbatch.core import keys
from llmbatch.core.workqueue import Backoff
from llmbatch.gateway.archive import BatchArchive

if TYPE_CHECKING:  # the listing cache assembles its loader
    from llmbatch.gateway.listcache import ListCache

log = logging.getLogger(__name__)

CHUNK_KEYS = 256
"""The background load reads whole tenants, about this many records at a time."""
RETRY_PASSES = 3
"""How many times the records skipped for a store error are read again."""
RETRY_BACKOFF = Backoff(base=2.0, cap=60.0, jitter=0.2)


def _namespace(key: str) -> str | None:
    parts = key.split("/")
    return parts[1] if len(parts) == 3 and key.startswith(keys.ARCHIVE_PREFIX) else None


class ArchiveLoader:
    """Puts the archived records into the batches' listing cache."""

    def __init__(
        self,
        archive: BatchArchive,
        cache: ListCache,
        ready: Callable[[], Awaitable[Any]],
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.archive = archive
        self.cache = cache
        self.ready = ready
        """Awaited before any record is read: the namespaces are known (records are shown only
        to the namespace they belong to)."""
        self.backoff = backoff or RETRY_BACKOFF
        self.sleep = sleep
        self.done = asyncio.Event()
        """Every tenant's records are in the listing (but those skipped for good)."""
        self._loaded: set[str] = set()
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._skipped: set[str] = set()

    async def ensure(self, namespace: str) -> None:
        """Return once ``namespace``'s records are in the listing."""
        loading = self._loading.get(namespace)
        if loading is not None:
            await asyncio.shield(loading)
        elif not self.done.is_set() and namespace not in self._loaded:
            await self._load([namespace], None)

    async def run(self) -> None:
        """Load every tenant's records, :data:`CHUNK_KEYS` at a time, then read the skipped
        ones again."""
        await self.ready()
        listed = await asyncio.to_thread(self.archive.keys)
        by_namespace: defaultdict[str, list[str]] = defaultdict(list)
        for key in listed:
            namespace = _namespace(key)
            if namespace is not None:
                by_namespace[namespace].append(key)
        chunk: list[str] = []
        chunk_keys: list[str] = []
        for namespace, record_keys in by_namespace.items():
            if namespace in self._loaded or namespace in self._loading:
                continue
            chunk.append(namespace)
            chunk_keys.extend(record_keys)
            if len(chunk_keys) >= CHUNK_KEYS:
                await self._load(chunk, chunk_keys)
                chunk, chunk_keys = [], []
        if chunk:
            await self._load(chunk, chunk_keys)
        self.done.set()
        await self._read_skipped()

    async def _read_skipped(self) -> None:
        rng = random.Random()
        for attempt in range(1, RETRY_PASSES + 1):
            if not self._skipped:
                return
            await self.sleep(self.backoff.delay(attempt, rng))
            again, self._skipped = sorted(self._skipped), set()
            records, failed = await self.archive.read_many(again)
            self._adopt(records)
            self._skipped.update(failed)
        if self._skipped:
            log.warning(
                "archive: %d records could not be read; they are left out of the listing "
                "until the gateway restarts (retrieve still reads them)",
                len(self._skipped),
            )

    async def stop(self) -> None:
        """Cancel the loads in flight."""
        loading = set(self._loading.values())
        for task in loading:
            task.cancel()
        await asyncio.gather(*loading, return_exceptions=True)

    async def _load(self, namespaces: list[str], record_keys: list[str] | None) -> None:
        """Read the records of ``namespaces`` (``record_keys``; None: list them) in one task
        that whoever waits for one of them shares (a listing request that goes away does not
        cancel the load others wait for)."""
        task = asyncio.create_task(self._read(namespaces, record_keys))
        for namespace in namespaces:
            self._loading[namespace] = task

        def loaded(_: asyncio.Task[None]) -> None:
            for namespace in namespaces:
                if self._loading.get(namespace) is task:
                    del self._loading[namespace]

        task.add_done_callback(loaded)
        await asyncio.shield(task)

    async def _read(self, namespaces: list[str], record_keys: list[str] | None) -> None:
        await self.ready()
        if record_keys is None:
            record_keys = []
            for namespace in namespaces:
                prefix = keys.tenant_area("archive", namespace)
                record_keys += await asyncio.to_thread(self.archive.keys, prefix)
        records, failed = await self.archive.read_many(record_keys)
        self._adopt(records)
        self._skipped.update(failed)
        self._loaded.update(namespaces)

    def _adopt(self, records: list[dict[str, Any]]) -> None:
        """Into the listing, the records of the namespaces as they are now (one that went
        while its records were read shows none of them)."""
        for record in records:
            namespace = str(record["metadata"]["namespace"])
            if self.archive.belongs(namespace, record):
                self.cache.adopt_archived(namespace, record)
