"""The archive record of a finished Batch (llmbatch.core.archive) and the gateway reading it."""

from __future__ import annotations

import asyncio
import copy
import pathlib
from typing import Any

import pytest

from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity, record_belongs
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
    record = archive.decode(archive.encode(archive.archive_record(obj, 1795960000, "ns-uid")))
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
    assert record["tenantUID"] == "ns-uid"  # the namespace it belongs to, by identity
    assert len(archive.encode(record)) < 2048


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[]", b'{"kind": "BatchFile"}', b'{"kind": "Batch", "metadata": {"name": "x"}}'],
)
def test_anything_else_at_an_archive_key_is_not_a_record(data: bytes) -> None:
    with pytest.raises(archive.NotARecord):
        archive.decode(data)


TEAM_A = NamespaceIdentity(NS, "uid-a", created_at=1795950000)
TEAM_B = NamespaceIdentity("team-b", "uid-b", created_at=1795950000)


def test_the_gateway_reads_a_tenants_records_and_nothing_else(tmp_path: pathlib.Path) -> None:
    store = FilesystemStore(tmp_path / "store")
    reader = BatchArchive(store, {NS: TEAM_A, "team-b": TEAM_B}.get)
    record = archive.archive_record(finished_batch(), 1, TEAM_A.uid)
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
    loaded, failed = asyncio.run(reader.read_many(reader.keys()))
    assert sorted(r["metadata"]["name"] for r in loaded) == sorted(["batch-other", NAME])
    assert failed == []


def test_a_record_is_shown_only_to_the_namespace_it_was_archived_from(
    tmp_path: pathlib.Path,
) -> None:
    """A later namespace of the same name (another UID) sees none of the old records: bound
    ones by their UID, ones archived before records carried it by their batch's creation."""
    store = FilesystemStore(tmp_path / "store")
    current = {NS: TEAM_A}
    reader = BatchArchive(store, current.get)
    bound = archive.archive_record(finished_batch(), 1, TEAM_A.uid)
    legacy = archive.archive_record(finished_batch(), 1, TEAM_A.uid)
    del legacy["tenantUID"]
    legacy["metadata"]["name"] = "batch-legacy"
    store.put(keys.archive_key(NS, ID), archive.encode(bound))
    store.put(keys.archive_key(NS, "batch_legacy"), archive.encode(legacy))
    assert asyncio.run(reader.get(NS, ID)) is not None
    assert asyncio.run(reader.get(NS, "batch_legacy")) is not None  # created after team-a

    current[NS] = NamespaceIdentity(NS, "uid-a2", created_at=1795960000)  # deleted, made again
    assert asyncio.run(reader.get(NS, ID)) is None
    assert asyncio.run(reader.get(NS, "batch_legacy")) is None  # created before the new one
    del current[NS]  # deleted
    assert asyncio.run(reader.get(NS, ID)) is None
    assert not record_belongs(None, bound)
