"""The archive record of a finished Batch (llmbatch.core.archive) and the gateway reading it."""

from __future__ import annotations

import asyncio
import copy
import pathlib
from typing import Any

import pytest

from llmbatch.core import archive, keys
from llmbatch.gateway.archive import BatchArchive
from llmbatch.gateway.mapping import ANNOTATION_CREATED_NS, batch_to_openai
from llmbatch.storage import FilesystemStore

NS = "team-a"
NAME = "batch-0123456789abcdef01234567"
ID = "batch_0123456789abcdef01234567"


def finished_batch() -> dict[str, Any]:
    return {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "uid": "uid-1",
            "resourceVersion": "123",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "managedFields": [{"manager": "kopf"}],
            "finalizers": ["llmbatch.io/finalizer"],
            "labels": {"llmbatch.io/idempotency-key": "abc"},
            "annotations": {
                ANNOTATION_CREATED_NS: str(1795953599 * 10**9 + 5),
                "llmbatch.io/last-handled-configuration": '{"spec": "... 10 KB ..."}',
            },
        },
        "spec": {
            "endpoint": "/v1/chat/completions",
            "completionWindow": "24h",
            "metadata": {"project": "x"},
            "requests": [{"customID": "r1", "method": "POST", "url": "/v1/x", "body": {}}],
        },
        "status": {
            "status": "completed",
            "createdAt": 1795953600,
            "inProgressAt": 1795953601,
            "finalizingAt": 1795953660,
            "completedAt": 1795953661,
            "outputFileID": "file-" + "b" * 32,
            "requestCounts": {"total": 1, "completed": 1, "failed": 0},
            "model": "smollm2",
        },
    }


def test_a_record_reads_as_the_same_openai_batch_and_keeps_nothing_the_operator_needs() -> None:
    obj = finished_batch()
    record = archive.decode(archive.encode(archive.archive_record(obj, 1795960000)))
    assert batch_to_openai(record) == batch_to_openai(obj)  # what a client reads: unchanged
    assert archive.record_id(record) == ID
    meta = record["metadata"]
    assert set(meta) == {"name", "namespace", "uid", "creationTimestamp", "labels", "annotations"}
    assert meta["annotations"] == {
        ANNOTATION_CREATED_NS: obj["metadata"]["annotations"][ANNOTATION_CREATED_NS],
        keys.ANNOTATION_ARCHIVED: keys.archive_key(NS, ID),
    }
    assert "requests" not in record["spec"]
    assert record["archivedAt"] == 1795960000
    assert len(archive.encode(record)) < 2048


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[]", b'{"kind": "BatchFile"}', b'{"kind": "Batch", "metadata": {"name": "x"}}'],
)
def test_anything_else_at_an_archive_key_is_not_a_record(data: bytes) -> None:
    with pytest.raises(archive.NotARecord):
        archive.decode(data)


def test_the_gateway_reads_a_tenants_records_and_nothing_else(tmp_path: pathlib.Path) -> None:
    store = FilesystemStore(tmp_path / "store")
    reader = BatchArchive(store)
    record = archive.archive_record(finished_batch(), 1)
    store.put(keys.archive_key(NS, ID), archive.encode(record))
    # another tenant's key holding team-a's record (written by hand): never served as theirs
    store.put(keys.archive_key("team-b", ID), archive.encode(record))
    store.put(keys.archive_key(NS, "batch_junk"), b"junk")
    other = copy.deepcopy(record)
    other["metadata"]["name"] = "batch-other"
    store.put(keys.archive_key(NS, "batch_other"), archive.encode(other))

    got = asyncio.run(reader.get(NS, ID))
    assert got is not None
    assert got["status"]["status"] == "completed"
    assert asyncio.run(reader.get("team-b", ID)) is None
    assert asyncio.run(reader.get(NS, "batch_missing")) is None
    loaded = asyncio.run(reader.load())
    assert sorted(r["metadata"]["name"] for r in loaded) == sorted(["batch-other", NAME])
