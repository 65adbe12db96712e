"""Fair shares across tenants on the real control plane (#33): one tenant's backlog does not
hold back another tenant's first batch."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest

from llmbatch.core.scheduling import WEIGHT_ANNOTATION
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
    kubectl_json,
    read_lines,
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


def _fair_pool(cluster: Any, tmp_path: pathlib.Path, tenant: str, preemption: str) -> str:
    """One slot of two seats, no slot queue, ``tenant`` guaranteed one seat; an engine of two
    sequences at 0.5 s a request, so a shard of 120 requests holds its seat for a minute."""
    return one_slot_pool(
        cluster,
        tmp_path,
        ["--latency-seconds=0.5", "--max-num-seqs=2"],
        slotConcurrency=2,
        slotQueue=0,
        fairSharing={"tenants": [{"namespace": tenant, "minSeats": 1}], "preemption": preemption},
    )


def test_preemption_across_tenants_only_where_the_pool_allows_it(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    """Two pools, each one slot of two seats full of tenant A's minute-long shards with more
    of A's waiting; tenant B (guaranteed one seat) creates a batch on each. Where the pool
    allows preemption across tenants, B takes a seat from A within seconds and A's preempted
    batch still completes with every answer once; where it does not, B waits for A's shard to
    end. The pool shows both tenants' seats against their shares, and a weight annotation
    changes B's share without restarting anything."""
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other)
    try:
        allowed = _fair_pool(cluster, tmp_path, other, "BelowGuarantee")
        never = _fair_pool(cluster, tmp_path, other, "Never")
        heavy = {pool: names(f"a{i}", 3) for i, pool in enumerate((allowed, never))}
        create_many(
            cluster,
            tmp_path,
            [batch_manifest(n, namespace, p, 120) for p, batch in heavy.items() for n in batch],
        )

        def granted_of(ns: str, batch_names: list[str]) -> list[float]:
            found = statuses(cluster, ns)
            at = [granted(operator_process, ns, found[n], ended=True) for n in batch_names]
            return [t for t in at if t is not None]

        for pool in (allowed, never):
            wait_for(lambda p=pool: len(granted_of(namespace, heavy[p])) >= 2, 180, "A running")
        light = {pool: names(f"b{i}", 1) for i, pool in enumerate((allowed, never))}
        sent = time.time()
        create_many(
            cluster,
            tmp_path,
            [batch_manifest(n, other, p, 40) for p, batch in light.items() for n in batch],
        )
        at = wait_for(lambda: granted_of(other, light[allowed]), 60, "B granted by preemption")[0]
        assert at - sent < 30, at - sent
        assert not granted_of(other, light[never]), "preempted where the pool does not allow it"
        events = cluster.kubectl("get", "events", "-A", "--field-selector", "reason=Preempted")
        across = [line for line in events.splitlines() if "below its guaranteed seats" in line]
        assert any(f"{allowed}-slot-" in line for line in across), events
        assert not any(f"{never}-slot-" in line for line in across), events

        def shown() -> dict[str, Any]:
            fair = kubectl_json(cluster, "get", "batchpool", allowed)["status"]["fairSharing"]
            seats = {t["namespace"]: (t["seats"], t["share"]) for t in fair["tenants"]}
            return fair if seats.get(other) == (1, "1.00") else {}

        fair = wait_for(shown, 20, "B's seat in the pool's status")
        seats = {t["namespace"]: (t["seats"], t["share"]) for t in fair["tenants"]}
        assert fair["activeTenants"] == 2
        assert seats[namespace] == (1, "1.00"), fair
        table = cluster.kubectl("get", "batchpool", allowed)
        assert "TENANTS" in table
        assert "TOP" in table

        cluster.kubectl("annotate", "namespace", other, f"{WEIGHT_ANNOTATION}=3")

        def weighted() -> bool:
            fair = kubectl_json(cluster, "get", "batchpool", allowed)["status"]["fairSharing"]
            return any(t["namespace"] == other and t["weight"] == "3" for t in fair["tenants"])

        wait_for(weighted, 60, "B's new weight in the pool's status")

        def done(ns: str, batch_names: list[str]) -> bool:
            found = statuses(cluster, ns)
            return all(
                (found[n].get("status") or {}).get("status") == "completed" for n in batch_names
            )

        wait_for(lambda: done(namespace, heavy[allowed]), 400, "A's batches done")
        preempted = 0
        for name in heavy[allowed]:
            status = statuses(cluster, namespace)[name]["status"]
            preempted += status["shards"][0].get("preemptions", 0)
            ids = [
                line["custom_id"]
                for line in read_lines(operator_process, namespace, status["outputFileID"])
            ]
            assert sorted(ids) == sorted({*ids}), "an answer twice"
            assert len(ids) == 120
        assert preempted == 1
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false")
