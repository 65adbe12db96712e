"""Fair shares across tenants on the real control plane (#33): one tenant's backlog does not
hold back another tenant's first batch."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest

from tests.fixtures.operator import OperatorProcess
from tests.integration.test_backlog import (
    batch_manifest,
    create_many,
    granted,
    names,
    one_slot_pool,
    statuses,
)
from tests.integration.test_operator import (
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    wait_for,
)

pytestmark = pytest.mark.timeout(600)


def test_a_second_tenants_batch_is_granted_at_the_next_free_seat(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """One slot of two seats (and two queued): tenant A queues 20 batches, then tenant B
    creates one. Round-robin across batches granted B after every A batch created before it;
    fair sharing grants B at the next seat, at most two of A's shards in between."""
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        pool = one_slot_pool(cluster, tmp_path, ["--latency-seconds=1.5"], slotConcurrency=2)
        backlog = names("a", 20)
        create_many(cluster, tmp_path, [batch_manifest(n, namespace, pool, 1) for n in backlog])

        def grants_of_a() -> dict[str, float]:
            found = statuses(cluster, namespace)
            at = {n: granted(operator_process, namespace, found[n], ended=True) for n in backlog}
            return {n: t for n, t in at.items() if t is not None}

        wait_for(lambda: len(grants_of_a()) >= 4, 180, "A's first shards on the slot")
        (late,) = names("b", 1)
        sent = time.time()
        create_many(cluster, tmp_path, [batch_manifest(late, other, pool, 1)])
        at = wait_for(
            lambda: granted(operator_process, other, statuses(cluster, other)[late], ended=True),
            120,
            "B's batch granted",
        )
        between = sorted(t for t in grants_of_a().values() if sent < t < at)
        assert len(between) <= 2, (at - sent, between)
        assert len(grants_of_a()) < len(backlog)  # A still had work waiting: B went ahead of it
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false")
