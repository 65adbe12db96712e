"""Fair sharing in the pool scheduler's rounds (#33), with the reconciler harness: a tenant at
its maximum seats gets no free seat, and a tenant below its guarantee takes a running shard of
a tenant above its share only on a pool that allows it."""

from __future__ import annotations

import pathlib

import pytest

from llmbatch.core import keys
from llmbatch.storage.slotchannel import read_lease
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_slot_scheduler import beat, channel

OTHER = "tenant-b"


def submit(h: ReconcilerHarness, name: str, namespace: str = TENANT) -> str:
    file_id = f"file-{name[-32:]:0>32}"
    h.kube.add("batchfiles", make_input_file(h.store, file_id, 2, namespace=namespace))
    h.kube.add("batches", make_batch(name, namespace=namespace, input_file_id=file_id))
    h.step_until(name, "in_progress", namespace=namespace)
    h.step(name, namespace=namespace)  # the shard specs: queued
    return name


def slot_of(h: ReconcilerHarness, name: str, namespace: str = TENANT) -> str | None:
    uid = h.batch(name, namespace)["metadata"]["uid"]
    lease = read_lease(h.store, keys.shard_lease_key(keys.shard_prefix(namespace, uid, 0)))
    return lease.slot if lease is not None and lease.state == "granted" else None


def harness(tmp_path: pathlib.Path, **fair: object) -> ReconcilerHarness:
    h = ReconcilerHarness(tmp_path)
    pool = make_pool(maxSlots=1, slotConcurrency=2, slotQueue=0, fairSharing=fair)
    h.kube.add("batchpools", pool)
    return h


def test_a_tenant_at_its_maximum_gets_no_free_seat(tmp_path: pathlib.Path) -> None:
    h = harness(tmp_path, tenants=[{"namespace": TENANT, "maxSeats": 1}])
    first, second = submit(h, "batch-" + "a" * 24), submit(h, "batch-" + "b" * 24)
    h.pool_round()
    (slot,) = h.jobs()
    beat(h, slot["metadata"]["name"])
    h.pool_round()
    assert [slot_of(h, first) is None, slot_of(h, second) is None].count(True) == 1
    fair = h.kube.get("batchpools", None, "pool-a")["status"]["fairSharing"]
    (listed,) = fair["tenants"]
    assert (listed["seats"], listed["waiting"]) == (1, 1)


@pytest.mark.parametrize("allowed", [True, False])
def test_a_tenant_below_its_guarantee_preempts_only_where_the_pool_allows(
    tmp_path: pathlib.Path, allowed: bool
) -> None:
    h = harness(
        tmp_path,
        tenants=[{"namespace": OTHER, "minSeats": 1}],
        preemption="BelowGuarantee" if allowed else "Never",
    )
    heavy = [submit(h, f"batch-{c * 24}") for c in "cde"]
    h.pool_round()
    (slot,) = h.jobs()
    name = slot["metadata"]["name"]
    beat(h, name)
    h.pool_round()
    assert sum(slot_of(h, b) is not None for b in heavy) == 2  # both seats: tenant A's
    light = submit(h, "batch-" + "f" * 24, OTHER)
    beat(h, name, seq=2)
    h.pool_round()
    assert ("Preempted" in h.reasons()) is allowed
    assert len(channel(h, name).assignments()) == (1 if allowed else 2)
    assert slot_of(h, light, OTHER) is None  # the seat frees once the victim has stopped
