"""The archive of finished batches, as the gateway reads it (``core.archive`` writes the rule).

Retention moves a finished Batch out of the API server into ``archive/<namespace>/<batch
id>.json``; ``GET /v1/batches/{id}`` falls back to the record and the listing holds the records
beside the live objects (``gateway.archiveloader`` puts them there), so the history a client sees
does not change when it moves. A record is shown only to the namespace it was archived from, not
to a later namespace of the same name (``core.identity.record_belongs``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity, record_belongs
from llmbatch.gateway import metrics
from llmbatch.storage.base import ObjectNotFound, ObjectStore, StoreError

log = logging.getLogger(__name__)

READ_CONCURRENCY = 16
"""Records read at once when the archive is loaded (store calls run in threads)."""

Tenants = Callable[[str], NamespaceIdentity | None]
"""The namespace of a name as it is now (``gateway.namespaces.Namespaces.identity``)."""


class BatchArchive:
    """Reads archived Batch records from the store."""

    def __init__(self, store: ObjectStore, tenants: Tenants) -> None:
        self.store = store
        self.tenants = tenants

    async def get(self, namespace: str, batch_id: str) -> dict[str, Any] | None:
        """The record of one archived batch of ``namespace`` as it is now; None when there is
        none (or it is an earlier namespace's of the same name)."""
        try:
            record = await self._read(keys.archive_key(namespace, batch_id))
        except archive.NotARecord:
            return None
        return record if record is not None and self.belongs(namespace, record) else None

    def belongs(self, namespace: str, record: dict[str, Any]) -> bool:
        """Whether a record (or a Batch object) is of the namespace of that name now."""
        return record_belongs(self.tenants(namespace), record)

    def keys(self, prefix: str = keys.ARCHIVE_PREFIX) -> list[str]:
        """The record keys under ``prefix`` (blocking: call it in a thread)."""
        return [info.key for info in self.store.list(prefix)]

    async def read_many(self, record_keys: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
        """The records at ``record_keys`` (:data:`READ_CONCURRENCY` at a time) and the keys that
        could not be read for a store error: skipped and counted, the others load. A key that
        holds no record is left out (and counted). Cancelled, it starts no further read."""
        todo = deque(record_keys)
        records: list[dict[str, Any]] = []
        failed: list[str] = []

        async def reader() -> None:
            while todo:
                key = todo.popleft()
                try:
                    record = await self._read(key)
                except StoreError as exc:
                    log.warning("archive: reading %s failed (%s); skipped for now", key, exc)
                    metrics.ARCHIVE_UNREADABLE.inc()
                    failed.append(key)
                except archive.NotARecord:
                    metrics.ARCHIVE_UNREADABLE.inc()
                else:
                    if record is not None:
                        records.append(record)

        async with asyncio.TaskGroup() as readers:
            for _ in range(min(READ_CONCURRENCY, len(todo))):
                readers.create_task(reader())
        return records, failed

    async def _read(self, key: str) -> dict[str, Any] | None:
        """The record at ``key``; None when there is none. :class:`~llmbatch.core.archive.
        NotARecord` for bytes that are not a record of the namespace the key names, a
        ``StoreError`` when the store fails."""
        try:
            record = archive.decode(await asyncio.to_thread(self.store.get, key))
        except ObjectNotFound:
            return None
        except archive.NotARecord as exc:
            log.warning("archive: %s is not a batch record (%s); ignoring it", key, exc)
            raise
        parts = key.split("/")
        if len(parts) != 3 or record["metadata"].get("namespace") != parts[1]:
            log.warning("archive: %s holds another namespace's batch; ignoring it", key)
            raise archive.NotARecord(f"{key} holds another namespace's batch")
        return record
