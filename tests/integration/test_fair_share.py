"""Fair shares across tenants on the real control plane (#33): one tenant's backlog does not
hold back another tenant's first batch."""

from __future__ import annotations

import pathlib
import time
import uuid
from typing import Any

import pytest

from llmbatch.api.slot import ShardLease
from llmbatch.core import keys
from tests.fixtures.operator import OperatorProcess, simulated_pool
from tests.integration.test_backlog import batch_manifest, create_many, names, statuses
from tests.integration.test_operator import (
    _POOLS,
    MODEL,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    store_of,
    wait_for,
)

pytestmark = pytest.mark.timeout(600)


def granted(operator: OperatorProcess, namespace: str, batch: dict[str, Any]) -> float | None:
    """When the batch's first shard was granted, whether it still runs or has ended."""
    uid = batch["metadata"]["uid"]
    lease = store_of(operator).root / keys.shard_lease_key(keys.shard_prefix(namespace, uid, 0))
    if not lease.exists():
        return None
    at = ShardLease.model_validate_json(lease.read_bytes()).granted_at
    return at or None


def test_a_second_tenants_batch_is_granted_at_the_next_free_seat(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """One slot of two seats (and two queued): tenant A queues 20 batches, then tenant B
    creates one. Round-robin across batches granted B after every A batch created before it;
    fair sharing grants B at the next seat, at most two of A's shards in between."""
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        pool = f"pool-{uuid.uuid4().hex[:8]}"
        _POOLS.append(pool)
        manifest = simulated_pool(
            pool,
            MODEL,
            maxSlots=1,
            minSlots=1,
            slotConcurrency=2,
            shardRequests=1000,
            throughputPerSlot="1",
            executor={"engineArgs": ["--latency-seconds=1.5"], "terminationGraceSeconds": 2},
        )
        apply(cluster, tmp_path, manifest)
        backlog = names("a", 20)
        create_many(cluster, tmp_path, [batch_manifest(n, namespace, pool, 1) for n in backlog])

        def grants_of_a() -> dict[str, float]:
            found = statuses(cluster, namespace)
            times = {n: granted(operator_process, namespace, found[n]) for n in backlog}
            return {n: t for n, t in times.items() if t is not None}

        wait_for(lambda: len(grants_of_a()) >= 4, 180, "A's first shards on the slot")
        (late,) = names("b", 1)
        sent = time.time()
        create_many(cluster, tmp_path, [batch_manifest(late, other, pool, 1)])
        at = wait_for(
            lambda: granted(operator_process, other, statuses(cluster, other)[late]),
            120,
            "B's batch granted",
        )
        between = sorted(t for t in grants_of_a().values() if sent < t < at)
        assert len(between) <= 2, (at - sent, between)
        assert len(grants_of_a()) < len(backlog)  # A still had work waiting: B went ahead of it
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false")
