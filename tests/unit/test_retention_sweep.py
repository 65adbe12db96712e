"""The retention sweep (llmbatch.controller.retention) on an in-memory API and a real store."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
from typing import Any

from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.retention import RetentionSweeper
from llmbatch.core import archive, keys
from llmbatch.core.retention import DAY, SETTLE_SECONDS, RetentionPolicy
from llmbatch.storage import FilesystemStore
from tests.fixtures.fakekube import FakeKube

T0 = 1_800_000_000
NS = "team-a"


class RacingKube(FakeKube):
    """The shared fake API, where a DELETE /v1/files may win the race between list and delete."""

    deleted_elsewhere = False

    async def delete_custom(
        self,
        plural: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        *,
        orphan: bool = False,
    ) -> bool:
        deleted = await super().delete_custom(plural, namespace, name, uid, orphan=orphan)
        return deleted and not self.deleted_elsewhere


def file_obj(
    name: str, *, purpose: str = "batch", expires: int, key: str | None = None, created: int = T0
) -> Any:
    return {
        "metadata": {"namespace": NS, "name": name},
        "spec": {
            "id": name,
            "purpose": purpose,
            "bytes": 4,
            "storageKey": key or keys.file_key(NS, name),
            "createdAt": created,
            "expiresAt": expires,
        },
    }


def batch_obj(name: str, phase: str, input_file: str, **status: Any) -> Any:
    return {
        "metadata": {"namespace": NS, "name": name, "uid": f"uid-{name}"},
        "spec": {"inputFileID": input_file},
        "status": {"status": phase, **status},
    }


def counter(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels or None)
    return value or 0.0


def make(tmp_path: pathlib.Path, now: list[float]) -> tuple[RacingKube, FilesystemStore, Any]:
    kube = RacingKube()
    store = FilesystemStore(tmp_path / "store")
    config = OperatorConfig(store_uri="file:///unused", executor_store_uri="file:///unused")
    sweeper = RetentionSweeper(kube, store, config, clock=lambda: now[0])  # type: ignore[arg-type]
    return kube, store, sweeper


def test_sweep_deletes_due_files_and_work_areas_and_a_second_sweep_is_a_no_op(
    tmp_path: pathlib.Path,
) -> None:
    now = [float(T0 + DAY + SETTLE_SECONDS)]
    kube, store, sweeper = make(tmp_path, now)
    for name in ("file-old", "file-running", "file-done", "file-new"):
        store.put(keys.file_key(NS, name), b"data")
    kube.add("batchfiles", file_obj("file-old", expires=T0 + DAY))
    kube.add("batchfiles", file_obj("file-running", expires=T0 + DAY))
    kube.add("batchfiles", file_obj("file-done", expires=T0 + DAY))
    kube.add("batchfiles", file_obj("file-new", expires=T0 + 2 * DAY, created=T0 + DAY))
    kube.add("batches", batch_obj("batch-run", "in_progress", "file-running"))
    accepted = {"inProgressAt": T0 + 10, "inputKey": keys.file_key(NS, "file-done")}
    kube.add(
        "batches", batch_obj("batch-done", "completed", "file-done", completedAt=T0, **accepted)
    )
    work = keys.shard_prefix(NS, "uid-batch-done", 0)
    store.put(f"{work}/spec.json", b"{}")
    store.put(f"{work}/chunk-00000.jsonl", b"12345")
    running_work = keys.shard_spec_key(NS, "uid-batch-run", 0)
    store.put(running_work, b"{}")
    expired_before = counter("llmbatch_retention_files_expired_total", purpose="batch")
    freed_before = counter("llmbatch_retention_freed_bytes_total", area="input")

    report = asyncio.run(sweeper.sweep())

    assert (report.files_deleted, report.work_areas_removed, report.errors) == (2, 1, 0)
    assert report.bytes_freed == 4 + 4 + 2 + 5
    left = {name for (plural, _, name) in kube.objects if plural == "batchfiles"}
    assert left == {"file-running", "file-new"}
    assert store.head(keys.file_key(NS, "file-old")) is None
    assert store.head(keys.file_key(NS, "file-done")) is None
    assert store.head(keys.file_key(NS, "file-running")) is not None
    assert not list(store.list(keys.work_prefix(NS, "uid-batch-done") + "/"))
    assert store.head(running_work) is not None  # a running batch's work area stays
    done = kube.objects["batches", NS, "batch-done"]["status"]
    assert done["workRemovedAt"] == int(now[0])
    # The running batch's input shows who uses it and when it is planned to go.
    running = kube.objects["batchfiles", NS, "file-running"]["status"]
    assert running["usedBy"] == ["batch_run"]
    assert counter("llmbatch_retention_files_expired_total", purpose="batch") == expired_before + 2
    assert counter("llmbatch_retention_freed_bytes_total", area="input") == freed_before + 8

    kube.calls.clear()
    again = asyncio.run(sweeper.sweep())
    assert not again.changed
    writes = [call for call in kube.calls if call[0] in ("patch-status", "delete")]
    assert writes == []  # nothing deleted, nothing patched


def test_a_sweep_interrupted_after_the_bytes_finishes_the_object(tmp_path: pathlib.Path) -> None:
    """Bytes first, then the object: a crash in between leaves an object the next sweep removes."""
    now = [float(T0 + DAY)]
    kube, _store, sweeper = make(tmp_path, now)
    kube.add("batchfiles", file_obj("file-half", expires=T0 + 5))  # its bytes are gone already
    report = asyncio.run(sweeper.sweep())
    assert (report.files_deleted, report.bytes_freed) == (1, 0)
    assert not kube.objects


def test_object_already_gone_counts_as_done(tmp_path: pathlib.Path) -> None:
    now = [float(T0 + DAY)]
    kube, store, sweeper = make(tmp_path, now)
    kube.add("batchfiles", file_obj("file-x", expires=T0 + 5))
    store.put(keys.file_key(NS, "file-x"), b"data")
    kube.deleted_elsewhere = True  # DELETE /v1/files won the race between list and delete
    report = asyncio.run(sweeper.sweep())
    assert (report.files_deleted, report.errors) == (0, 0)
    assert store.head(keys.file_key(NS, "file-x")) is None


def test_a_foreign_storage_key_is_never_deleted(tmp_path: pathlib.Path) -> None:
    now = [float(T0 + DAY)]
    kube, store, sweeper = make(tmp_path, now)
    victim = keys.file_key("team-b", "file-theirs")
    store.put(victim, b"theirs")
    kube.add("batchfiles", file_obj("file-mine", expires=T0 + 5, key=victim))
    report = asyncio.run(sweeper.sweep())
    assert report.files_deleted == 1
    assert store.head(victim) is not None


def test_pool_retention_and_global_defaults_apply(tmp_path: pathlib.Path) -> None:
    now = [float(T0 + 100)]
    kube, _store, sweeper = make(tmp_path, now)
    sweeper.config = OperatorConfig(
        store_uri="file:///unused",
        executor_store_uri="file:///unused",
        retention=RetentionPolicy(unused_input_seconds=50),
    )
    kube.add("batchfiles", file_obj("file-unused", expires=T0 + DAY))
    kube.add("batchfiles", file_obj("file-accepted", expires=T0 + DAY))
    kube.add(
        "batches",
        batch_obj(
            "batch-a",
            "completed",
            "file-accepted",
            inProgressAt=T0,
            inputKey="k",
            completedAt=T0 + 10,
            pool="pool-slow",
        ),
    )
    kube.add(
        "batchpools",
        {"metadata": {"name": "pool-slow"}, "spec": {"retention": {"inputAfterBatchSeconds": 500}}},
    )
    report = asyncio.run(sweeper.sweep())
    assert report.files_deleted == 1
    assert ("batchfiles", NS, "file-accepted") in kube.objects
    status = kube.objects["batchfiles", NS, "file-accepted"]["status"]
    assert status["expiresAt"] == T0 + 10 + 500
    now[0] = T0 + 510
    assert asyncio.run(sweeper.sweep()).files_deleted == 1
    assert not [k for k in kube.objects if k[0] == "batchfiles"]


# --- finished batches leave the API server for the archive ------------------------------------


def finished(name: str, at: int, **spec: Any) -> Any:
    obj = batch_obj(name, "completed", "", completedAt=at, workRemovedAt=at + SETTLE_SECONDS)
    obj["metadata"]["annotations"] = {"llmbatch.io/last-handled-configuration": "{...}"}
    obj["spec"].update(spec)
    return obj


def test_a_finished_batch_is_archived_when_its_results_expire_and_then_deleted(
    tmp_path: pathlib.Path,
) -> None:
    now = [float(T0 + 7 * DAY - 1)]
    kube, store, sweeper = make(tmp_path, now)
    kube.add("batches", finished("batch-done", T0))
    kube.add("batches", finished("batch-short", T0, outputExpiresAfterSeconds=3600))
    kube.add("batches", batch_obj("batch-run", "in_progress", ""))

    report = asyncio.run(sweeper.sweep())  # the short one's results expired after an hour
    assert report.batches_archived == 1
    assert ("batches", NS, "batch-short") not in kube.objects
    assert ("delete-orphan", "batches", "batch-short") in kube.calls  # its files keep theirs
    record = archive.decode(store.get(keys.archive_key(NS, "batch_short")))
    assert record["status"]["status"] == "completed"
    assert record["metadata"]["annotations"] == {
        keys.ANNOTATION_ARCHIVED: keys.archive_key(NS, "batch_short")
    }
    # bound to its namespace by identity: a later namespace of the same name never sees it
    assert record["tenantUID"] == kube.namespace_obj(NS)["metadata"]["uid"]

    now[0] = T0 + 7 * DAY  # the default: the 7 days of its results
    assert asyncio.run(sweeper.sweep()).batches_archived == 1
    assert store.head(keys.archive_key(NS, "batch_done")) is not None
    assert ("batches", NS, "batch-run") in kube.objects  # a running batch never goes
    assert store.head(keys.archive_key(NS, "batch_run")) is None


def test_the_pool_and_the_operator_setting_choose_when_batches_leave(
    tmp_path: pathlib.Path,
) -> None:
    now = [float(T0 + 120)]
    kube, _, sweeper = make(tmp_path, now)
    kube.add(
        "batchpools",
        {"metadata": {"name": "quick"}, "spec": {"retention": {"batchSeconds": 60}}},
    )
    quick = finished("batch-quick", T0)
    quick["status"]["pool"] = "quick"
    kube.add("batches", quick)
    kube.add("batches", finished("batch-other", T0))
    asyncio.run(sweeper.sweep())
    assert ("batches", NS, "batch-quick") not in kube.objects
    assert ("batches", NS, "batch-other") in kube.objects
    sweeper.config = dataclasses.replace(
        sweeper.config, retention=RetentionPolicy(batch_seconds=100)
    )
    asyncio.run(sweeper.sweep())
    assert ("batches", NS, "batch-other") not in kube.objects


def test_an_archive_cut_short_is_finished_by_the_next_sweep(tmp_path: pathlib.Path) -> None:
    """Annotated, then the operator stopped (and the record was lost): the next sweep writes
    the record again and deletes, whatever the clock says."""
    now = [float(T0 + 10)]
    kube, store, sweeper = make(tmp_path, now)
    obj = finished("batch-half", T0)
    obj["metadata"]["annotations"][keys.ANNOTATION_ARCHIVED] = keys.archive_key(NS, "batch_half")
    kube.add("batches", obj)
    assert asyncio.run(sweeper.sweep()).batches_archived == 1
    assert archive.decode(store.get(keys.archive_key(NS, "batch_half")))["metadata"]["name"] == (
        "batch-half"
    )


def test_a_finished_batch_whose_work_area_is_still_there_waits(tmp_path: pathlib.Path) -> None:
    now = [float(T0 + 30 * DAY)]
    kube, _, sweeper = make(tmp_path, now)
    obj = batch_obj("batch-fresh", "completed", "", completedAt=T0)  # no workRemovedAt yet
    kube.add("batches", obj)
    report = asyncio.run(sweeper.sweep())
    assert report.work_areas_removed == 1
    assert report.batches_archived == 0  # next sweep: its deletion then has nothing to clean
    assert asyncio.run(sweeper.sweep()).batches_archived == 1
