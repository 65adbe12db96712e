"""The archive of finished batches, as the gateway reads it (``core.archive`` writes the rule).

Retention moves a finished Batch out of the API server into ``archive/<namespace>/<batch
id>.json``; ``GET /v1/batches/{id}`` falls back to the record and the listing cache holds the
records beside the live objects, so the history a client sees does not change when it moves.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from llmbatch.core import archive, keys
from llmbatch.storage.base import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

READ_CONCURRENCY = 16
"""Records read at once when the archive is loaded (store calls run in threads)."""


class BatchArchive:
    """Reads archived Batch records from the store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def get(self, namespace: str, batch_id: str) -> dict[str, Any] | None:
        """The record of one archived batch of ``namespace``; None when there is none."""
        return await self._read(keys.archive_key(namespace, batch_id), namespace)

    async def load(self) -> list[dict[str, Any]]:
        """Every record (the gateway's listing holds them all: a few hundred bytes each)."""
        listed = await asyncio.to_thread(lambda: list(self.store.list(keys.ARCHIVE_PREFIX)))
        seats = asyncio.Semaphore(READ_CONCURRENCY)

        async def read(key: str) -> dict[str, Any] | None:
            async with seats:
                return await self._read(key, key.split("/")[1] if key.count("/") == 2 else None)

        records = await asyncio.gather(*(read(info.key) for info in listed))
        return [r for r in records if r is not None]

    async def _read(self, key: str, namespace: str | None) -> dict[str, Any] | None:
        try:
            record = archive.decode(await asyncio.to_thread(self.store.get, key))
        except ObjectNotFound:
            return None
        except archive.NotARecord as exc:
            log.warning("archive: %s is not a batch record (%s); ignoring it", key, exc)
            return None
        if namespace is None or record["metadata"].get("namespace") != namespace:
            log.warning("archive: %s holds another namespace's batch; ignoring it", key)
            return None
        return record
