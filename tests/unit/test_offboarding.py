"""Offboarding (``core.offboarding``, ``controller.offboarding``): a deleted tenant namespace's
archived records, file bytes, inline inputs and work areas are erased from the store once the
grace period after its deletion ended; a later namespace of the same name keeps its own data.
The real control plane: tests/integration/test_tenancy.py."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.offboarding import UNREFERENCED_SECONDS, TenantSweeper
from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity
from llmbatch.core.offboarding import Incarnation, plan_offboarding
from llmbatch.storage import FilesystemStore
from tests.fixtures.fakekube import FakeKube

NS = "team-o"
DAY = 86400
T0 = 1_800_000_000
GRACE = 7 * DAY


def ns(uid: str = "u1", deleted_at: int | None = None) -> NamespaceIdentity:
    return NamespaceIdentity(NS, uid, created_at=T0 - DAY, deleted_at=deleted_at)


# --- the plan -------------------------------------------------------------------------------------


def test_a_namespace_is_noted_then_stamped_gone_then_erased_after_the_grace_period() -> None:
    plan = plan_offboarding([], {NS: ns()}, [], T0, GRACE)
    assert plan.register == [Incarnation(NS, "u1")]
    noted = plan.register
    assert plan_offboarding(noted, {NS: ns()}, [], T0 + 1, GRACE).stamp == []
    gone = plan_offboarding(noted, {}, [], T0 + 2, GRACE)
    assert gone.stamp == [Incarnation(NS, "u1", T0 + 2)]
    assert (gone.erase, gone.waiting) == ([], 1)
    stamped = gone.stamp
    assert plan_offboarding(stamped, {}, [], T0 + 2 + GRACE - 1, GRACE).erase == []
    due = plan_offboarding(stamped, {}, [], T0 + 2 + GRACE, GRACE)
    assert [(e.gone, e.successor) for e in due.erase] == [(stamped[0], None)]


def test_a_namespace_being_deleted_counts_from_its_deletion_but_is_erased_only_once_gone() -> None:
    noted = [Incarnation(NS, "u1")]
    terminating = {NS: ns(deleted_at=T0)}
    plan = plan_offboarding(noted, terminating, [], T0 + 5, GRACE)
    assert plan.stamp == [Incarnation(NS, "u1", T0)]
    stuck = plan_offboarding(plan.stamp, terminating, [], T0 + GRACE + 5, GRACE)
    assert stuck.erase == []  # still there (its Batches' clean-up runs first)
    assert len(plan_offboarding(plan.stamp, {}, [], T0 + GRACE + 5, GRACE).erase) == 1


def test_a_reused_name_erases_the_old_namespace_and_keeps_the_new_one() -> None:
    noted = [Incarnation(NS, "u1", T0)]
    plan = plan_offboarding(noted, {NS: ns("u2")}, [], T0 + GRACE, GRACE)
    assert plan.register == [Incarnation(NS, "u2")]
    assert [(e.gone.uid, e.successor) for e in plan.erase] == [("u1", ns("u2"))]


def test_a_namespace_made_and_deleted_between_two_passes_is_noted_gone() -> None:
    plan = plan_offboarding([], {}, [ns("u9")], T0, GRACE)
    assert plan.register == [Incarnation(NS, "u9", T0)]


def test_a_pass_cut_short_between_its_two_writes_keeps_the_earliest_going() -> None:
    notes = [Incarnation(NS, "u1"), Incarnation(NS, "u1", T0), Incarnation(NS, "u1", T0 + 9)]
    plan = plan_offboarding(notes, {}, [], T0 + GRACE, GRACE)
    assert [e.gone for e in plan.erase] == [Incarnation(NS, "u1", T0)]


def test_the_notes_are_read_from_their_keys_alone() -> None:
    assert keys.parse_tenant_key(keys.tenant_key(NS, "u1")) == (NS, "u1", None)
    assert keys.parse_tenant_key(keys.tenant_key(NS, "u1", T0)) == (NS, "u1", T0)
    for other in ("tenants/x", "tenants/a/b/c", "tenants/a/u.gone-x", "files/a/b"):
        assert keys.parse_tenant_key(other) is None


# --- the sweep on a store ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = float(T0)

    def __call__(self) -> float:
        return self.now


def record(n: int, tenant_uid: str) -> bytes:
    obj: dict[str, Any] = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {"name": f"batch-{n:024x}", "namespace": NS, "uid": f"b{n}"},
        "spec": {},
        "status": {"status": "completed"},
    }
    return archive.encode(archive.archive_record(obj, 1, tenant_uid))


def tenant_data(store: FilesystemStore, uid: str, tag: str) -> list[str]:
    """What a tenant leaves in the store: a record, file bytes, an inline input, a work area."""
    written = [
        keys.archive_key(NS, f"batch_{tag}"),
        keys.file_key(NS, f"file-{tag}"),
        keys.inline_staging_key(NS, f"batch_{tag}"),
        keys.shard_spec_key(NS, f"batch-uid-{tag}", 0),
    ]
    store.put(written[0], record(len(tag), uid))
    for key in written[1:]:
        store.put(key, b"x" * 10)
    return written


def swept_bytes(area: str) -> float:
    value = metrics.REGISTRY.get_sample_value("llmbatch_tenant_swept_bytes_total", {"area": area})
    return value or 0.0


def sweeps() -> float:
    return metrics.REGISTRY.get_sample_value("llmbatch_tenant_sweeps_total") or 0.0


def sweeper_on(tmp_path: pathlib.Path) -> tuple[FakeKube, FilesystemStore, TenantSweeper, Clock]:
    kube = FakeKube()
    store = FilesystemStore(tmp_path / "store")
    config = OperatorConfig(store_uri="file://x", executor_store_uri="file://x")
    clock = Clock()
    return kube, store, TenantSweeper(kube, store, config, clock), clock  # type: ignore[arg-type]


def present(store: FilesystemStore, written: list[str]) -> list[bool]:
    return [store.head(key) is not None for key in written]


def make_namespace(kube: FakeKube, uid: str, created: str = "2027-01-01T00:00:00Z") -> None:
    kube.deleted.discard(NS)
    kube.namespaces[NS] = {}
    kube.namespace_meta[NS] = {"uid": uid, "creationTimestamp": created}


def test_a_deleted_tenants_data_is_erased_after_the_grace_period(tmp_path: pathlib.Path) -> None:
    kube, store, sweeper, clock = sweeper_on(tmp_path)
    make_namespace(kube, "u1")
    written = tenant_data(store, "u1", "a")
    asyncio.run(sweeper.sweep())
    assert store.head(keys.tenant_key(NS, "u1")) is not None  # noted

    kube.delete_namespace(NS)
    clock.now += 60
    report = asyncio.run(sweeper.sweep())
    assert report.gone == 1
    assert store.head(keys.tenant_key(NS, "u1", int(clock.now))) is not None
    assert all(present(store, written))  # the grace period runs

    before = (sweeps(), swept_bytes("files"), swept_bytes("archive"))
    clock.now += GRACE
    report = asyncio.run(sweeper.sweep())
    assert report.erased == 1
    assert not any(present(store, written))
    assert list(store.list(keys.TENANTS_PREFIX)) == []  # its notes go last
    assert sweeps() - before[0] == 1
    assert swept_bytes("files") - before[1] == 10
    assert swept_bytes("archive") - before[2] > 0
    assert asyncio.run(sweeper.sweep()).erased == 0  # nothing left to do


def test_a_later_namespace_of_the_same_name_keeps_its_own_data(tmp_path: pathlib.Path) -> None:
    kube, store, sweeper, clock = sweeper_on(tmp_path)
    make_namespace(kube, "u1")
    old = tenant_data(store, "u1", "old")
    asyncio.run(sweeper.sweep())
    kube.delete_namespace(NS)
    make_namespace(kube, "u2", created="2027-01-15T08:00:00Z")
    new = tenant_data(store, "u2", "new")
    kube.add("batchfiles", {"metadata": {"name": "file-new", "namespace": NS}})
    kube.add(
        "batches", {"metadata": {"name": "batch-new", "namespace": NS, "uid": "batch-uid-new"}}
    )
    clock.now += 10
    asyncio.run(sweeper.sweep())  # the old one is found gone, the new one noted
    clock.now += GRACE
    asyncio.run(sweeper.sweep())  # the old records go; unreferenced bytes are only suspects
    assert present(store, old) == [False, True, True, True]
    clock.now += UNREFERENCED_SECONDS
    report = asyncio.run(sweeper.sweep())
    assert report.erased == 1
    # the old inline input is retention's (its Batch never came); everything else went
    assert present(store, old) == [False, False, True, False]
    assert all(present(store, new))
    assert [i.key for i in store.list(keys.TENANTS_PREFIX)] == [keys.tenant_key(NS, "u2")]


def test_a_namespace_seen_by_the_watch_between_passes_is_noted(tmp_path: pathlib.Path) -> None:
    _, store, sweeper, clock = sweeper_on(tmp_path)
    sweeper.notice(
        {"metadata": {"name": NS, "uid": "u7", "creationTimestamp": "2027-01-15T08:00:00Z"}}
    )
    asyncio.run(sweeper.sweep())  # gone again by the pass
    assert store.head(keys.tenant_key(NS, "u7", int(clock.now))) is not None
