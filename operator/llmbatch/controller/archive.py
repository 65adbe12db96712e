"""Moving a finished Batch from the API server to the archive in the store.

The retention sweep calls :func:`archive_batch` for each batch ``core.retention`` says is due:
the record goes to the store first (``core.archive``), then the Batch is annotated with its key
(``llmbatch.io/archived``: the deletion handler then leaves its result files alone, they keep
their own expiry), then deleted with its owned BatchFiles orphaned. Each step is idempotent and a
crash between two is finished by the next sweep: an annotated Batch is due whatever its clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from llmbatch.controller.kube import Kube
from llmbatch.core import archive, keys
from llmbatch.core.ids import batch_id_from_name
from llmbatch.storage.base import ObjectStore

log = logging.getLogger(__name__)


async def archive_batch(
    kube: Kube, store: ObjectStore, obj: Mapping[str, Any], now: int, tenant_uid: str
) -> bool:
    """Archive one finished Batch and delete it; True when this call deleted it.
    ``tenant_uid``: the UID of its namespace, kept in the record (``core.identity``)."""
    meta = obj.get("metadata") or {}
    namespace, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    key = keys.archive_key(namespace, batch_id_from_name(name))
    if (meta.get("annotations") or {}).get(keys.ANNOTATION_ARCHIVED) != key:
        data = archive.encode(archive.archive_record(obj, now, tenant_uid))
        await asyncio.to_thread(store.put, key, data)
        patch = {"metadata": {"annotations": {keys.ANNOTATION_ARCHIVED: key}}}
        if await kube.patch_custom("batches", namespace, name, patch) is None:
            return False  # gone meanwhile (the record stays: it is what the batch was)
    elif await asyncio.to_thread(store.head, key) is None:  # annotated, record lost: write it
        record = archive.archive_record(obj, now, tenant_uid)
        await asyncio.to_thread(store.put, key, archive.encode(record))
    deleted = await kube.delete_custom("batches", namespace, name, uid, orphan=True)
    if deleted:
        log.info("retention: archived batch %s/%s to %s and deleted it", namespace, name, key)
    return deleted


def is_archived(obj: Mapping[str, Any]) -> bool:
    """The Batch was archived: its deletion is the archive's, not a user's."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return bool(annotations.get(keys.ANNOTATION_ARCHIVED))
