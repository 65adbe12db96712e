"""Model revisions pinned per batch on the real control plane (#32 item 1, seed 000: "submission
pins the model revision"): a pool edited mid-batch keeps serving the batch pinned to the old
revision from a slot of that revision, while a batch accepted after the edit pins the new one
and runs on a slot of its own. Every slot's spec names the revision it loads (the simulated
engine stands in for the weights; tests/integration/test_executor_vllm.py loads real ones)."""

from __future__ import annotations

import contextlib
import json
import pathlib
import uuid
from typing import Any

from llmbatch.api.slot import SlotSpec
from llmbatch.core import keys
from llmbatch.storage import ObjectNotFound
from tests.fixtures.operator import ClusterCLI, OperatorProcess, simulated_pool
from tests.integration.test_operator import (
    _POOLS,
    MODEL,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    chat_requests,
    get_batch,
    make_batch,
    store_of,
    wait_for,
    wait_status,
)

TERMINAL = {"completed", "failed", "expired", "cancelled"}


class SlotRevisions:
    """The revision each of a pool's slots loads, read from their specs while they live (a slot
    that idled out takes its channel with it)."""

    def __init__(self, operator: OperatorProcess, pool: str) -> None:
        self.store = store_of(operator)
        self.pool = pool
        self.seen: dict[str, str | None] = {}

    def sample(self) -> None:
        prefix = keys.pool_slots_prefix(self.pool)
        for info in list(self.store.list(prefix)):
            slot, _, rest = info.key.removeprefix(prefix).partition("/")
            if rest != "spec.json" or slot in self.seen:
                continue
            with contextlib.suppress(ObjectNotFound):
                spec = SlotSpec.model_validate_json(self.store.get(info.key))
                self.seen[slot] = spec.model.revision


def test_a_pool_edit_mid_batch_keeps_the_batch_on_its_pinned_revision(
    cluster: ClusterCLI, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = f"pool-{uuid.uuid4().hex[:8]}"
    _POOLS.append(pool)
    manifest = simulated_pool(
        pool,
        MODEL,
        maxSlots=2,
        shardRequests=2,
        slotConcurrency=1,
        slotQueue=1,
        executor={"engineArgs": ["--latency-seconds=1.5"]},
    )
    manifest["spec"]["models"] = [{"name": MODEL, "source": "simulated", "revision": "v1"}]
    apply(cluster, tmp_path, manifest)
    first = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(12, "a"))
    wait_status(cluster, operator_process, namespace, first, {"in_progress"})
    # `kubectl edit batchpool`: the model moves to v2 while most of the first batch waits
    edit = [{"op": "replace", "path": "/spec/models/0/revision", "value": "v2"}]
    cluster.kubectl("patch", "batchpool", pool, "--type=json", "-p", json.dumps(edit))

    def edit_seen() -> bool:  # the operator acted on the edited spec: new batches pin v2
        obj = json.loads(cluster.kubectl("get", "batchpool", pool, "-o", "json"))
        observed = (obj.get("status") or {}).get("observedGeneration") or 0
        return bool(observed >= obj["metadata"]["generation"])

    wait_for(edit_seen, 60, "the operator to observe the pool edit")
    second = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(4, "b"))

    revisions = SlotRevisions(operator_process, pool)

    def ended(name: str) -> dict[str, Any] | None:
        revisions.sample()
        batch = get_batch(cluster, namespace, name)
        return batch if (batch.get("status") or {}).get("status") in TERMINAL else None

    ran: dict[str, set[str]] = {}
    for name, revision in ((first, "v1"), (second, "v2")):
        done = wait_for(lambda: ended(name), 300, f"batch {name} to end")  # noqa: B023
        status: dict[str, Any] = done["status"]
        assert status["status"] == "completed", status
        assert status["modelRevision"] == revision, status
        assert status["requestCounts"]["failed"] == 0, status
        slots = {shard["job"] for shard in status["shards"]}
        ran[revision] = slots
        # every shard ran on a slot loading the batch's revision: one output, one revision
        served = {slot: revisions.seen.get(slot, "(not seen)") for slot in slots}
        assert set(served.values()) == {revision}, (served, status)
    assert not ran["v1"] & ran["v2"], ran
