"""The archive of finished batches: the final Batch object kept in the store once it left the
API server (retention deletes finished Batches after ``batch_seconds``, docs/operations.md).

etcd holds the working set, not the history: the gateway answers ``GET /v1/batches/{id}`` and
the listing for an archived batch from its record here, mapped to the OpenAI object by the same
rule as a live one (``gateway.mapping``), so what a client reads does not change when the object
moves. A record is the object as the API server last served it, less what only the operator
needs (kopf's bookkeeping annotations, managed fields, inline requests), with the UID of the
namespace it was archived from (``core.identity``: a later namespace of the same name never sees
it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from llmbatch.core import keys
from llmbatch.core.identity import TENANT_UID_FIELD
from llmbatch.core.ids import batch_id_from_name

KIND = "Batch"
_KEPT_METADATA = ("name", "namespace", "uid", "creationTimestamp", "labels")
_DROPPED_ANNOTATIONS = ("llmbatch.io/last-handled-configuration", "kopf.zalando.org/")


class NotARecord(ValueError):
    """Bytes at an archive key that are not an archived Batch."""


def archive_record(obj: Mapping[str, Any], archived_at: int, tenant_uid: str) -> dict[str, Any]:
    """The record of a finished Batch object (a plain JSON object), annotated with its key as
    the object is before its deletion (``llmbatch.io/archived``); ``tenant_uid`` is the UID of
    its namespace."""
    meta = obj.get("metadata") or {}
    kept = {k: meta[k] for k in _KEPT_METADATA if k in meta}
    annotations = {
        k: v
        for k, v in (meta.get("annotations") or {}).items()
        if not any(k.startswith(prefix) for prefix in _DROPPED_ANNOTATIONS)
    }
    name = str(meta.get("name") or "")
    annotations[keys.ANNOTATION_ARCHIVED] = keys.archive_key(
        str(meta.get("namespace") or ""), batch_id_from_name(name)
    )
    kept["annotations"] = annotations
    spec = {k: v for k, v in (obj.get("spec") or {}).items() if k != "requests"}
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": KIND,
        "metadata": kept,
        "spec": spec,
        "status": dict(obj.get("status") or {}),
        "archivedAt": archived_at,
        TENANT_UID_FIELD: tenant_uid,
    }


def encode(record: Mapping[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def decode(data: bytes) -> dict[str, Any]:
    """A record read back; :class:`NotARecord` for anything else."""
    try:
        record = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise NotARecord(f"not JSON: {exc}") from exc
    if not isinstance(record, dict) or record.get("kind") != KIND:
        raise NotARecord("not an archived Batch")
    meta = record.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name.startswith("batch-"):
        raise NotARecord("an archived Batch without a batch name")
    return record


def record_id(record: Mapping[str, Any]) -> str:
    """The OpenAI id of an archived batch."""
    return batch_id_from_name(str(record["metadata"]["name"]))
