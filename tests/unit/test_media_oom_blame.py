"""A slot killed for memory with media inside blames that request, not its neighbours
(``core.oomblame``; the operator's hook in ``controller.settlement`` and ``slotwatch``).

The rule on its own, then the pool round on the shared fake API with a real store: two tenants'
batches share one slot, its pod ends ``OOMKilled`` while its last heartbeat named one request
with media; the one request becomes a ``media_out_of_memory`` error line when its shard runs
again, and neither shard is charged an attempt or the failed slot.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from llmbatch.api.slot import ShardLease, ShardReport, SlotHeartbeat
from llmbatch.core import keys
from llmbatch.core.leases import RunEnd, settle
from llmbatch.core.oomblame import (
    MEDIA_OUT_OF_MEMORY,
    MediaVerdict,
    blame_out_of_memory,
    out_of_memory_end,
)
from llmbatch.storage.shardresults import read_suspects
from tests.fixtures.builders import TENANT, WORKERS, make_pool
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_slot_scheduler import channel, lease_of, submit


def test_one_request_with_media_named_is_blamed_alone() -> None:
    verdict = blame_out_of_memory({"a-0": ["img-1"], "b-0": []})
    assert verdict == {"a-0": MediaVerdict(blamed=("img-1",))}


def test_several_named_become_suspects_and_none_named_is_no_verdict() -> None:
    verdict = blame_out_of_memory({"a-0": ["x", "y"], "b-0": ["z"], "c-0": []})
    assert verdict == {
        "a-0": MediaVerdict(suspects=("x", "y")),
        "b-0": MediaVerdict(suspects=("z",)),
    }
    assert blame_out_of_memory({"a-0": [], "b-0": []}) is None
    assert blame_out_of_memory({}) is None


@pytest.mark.parametrize("verdict", [None, MediaVerdict(blamed=("x",))])
def test_no_shard_of_the_slot_is_charged_an_attempt_or_the_slot(
    verdict: MediaVerdict | None,
) -> None:
    lease = ShardLease(generation=3, slot="slot-1", state="granted")
    lost = RunEnd("slot_failed", "slot-1", "slot Job failed (OOMKilled)")
    after = settle(lease, out_of_memory_end(lost, verdict), backoff_limit=3)
    assert after is not None
    assert (after.state, after.attempts, after.failed_slots) == ("released", 0, [])
    assert after.crashes == (1 if verdict else 0)
    usual = settle(lease, lost, backoff_limit=3)  # what a failed slot costs otherwise
    assert usual is not None
    assert (usual.attempts, usual.failed_slots) == (1, ["slot-1"])


# --- the pool round ------------------------------------------------------------------------


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool(maxSlots=1, slotConcurrency=2))
    return harness


def _shared_slot(h: ReconcilerHarness) -> tuple[dict[str, Any], str, str]:
    """Two batches' shards running on the one slot: (its Job, the batch with media, the other)."""
    media, other = submit(h, "batch-" + "m" * 24, 2), submit(h, "batch-" + "o" * 24, 2)
    h.pool_round()
    (job,) = h.jobs()
    ch = channel(h, job["metadata"]["name"])
    assert len(ch.assignments()) == 2
    return job, media, other


def _beat(h: ReconcilerHarness, job: dict[str, Any], named: dict[str, list[str]]) -> None:
    """The slot's heartbeat: its shards running, ``named`` requests with media (by batch)."""
    name = job["metadata"]["name"]
    ch = channel(h, name)
    uids = {h.batch(b)["metadata"]["uid"]: b for b in named}
    reports = [
        ShardReport(
            key=key,
            generation=a.generation,
            state="running",
            media_in_flight=named.get(uids.get(a.shard.batch_uid, ""), []),
        )
        for key, a in ch.assignments().items()
    ]
    heartbeat = SlotHeartbeat(
        slot=name, seq=1, state="ready", started_at=h.now - 9, ready_at=h.now - 8, shards=reports
    )
    ch.write_heartbeat(heartbeat)
    h.pool_round()


def _killed(h: ReconcilerHarness, job: dict[str, Any], reason: str) -> None:
    """The slot's pod ended with ``reason`` (OOMKilled: the kernel killed it for memory)."""
    name = job["metadata"]["name"]
    terminated = {"exitCode": 137, "reason": reason}
    h.kube.add(
        "pods",
        {
            "metadata": {
                "name": f"{name}-x1",
                "namespace": WORKERS,
                "labels": {"llmbatch.io/pool": "pool-a", "llmbatch.io/slot": name},
            },
            "status": {
                "phase": "Failed",
                "containerStatuses": [{"name": "executor", "state": {"terminated": terminated}}],
            },
        },
    )
    h.finish_job(job, failed="Job has reached the specified backoff limit")
    h.pool_round()


def test_a_slot_killed_for_memory_blames_its_one_request_with_media(h: ReconcilerHarness) -> None:
    job, media, other = _shared_slot(h)
    _beat(h, job, {media: ["req-1"]})
    _killed(h, job, "OOMKilled")
    for batch in (media, other):
        lease = lease_of(h, batch)
        assert isinstance(lease, ShardLease)
        assert (lease.attempts, lease.failed_slots) == (0, []), batch
    assert lease_of(h, media).crashes == 1  # type: ignore[attr-defined]
    assert lease_of(h, other).crashes == 0  # type: ignore[attr-defined]
    assert "SlotOutOfMemory" in h.reasons()
    uid = h.batch(media)["metadata"]["uid"]
    assert read_suspects(h.store, keys.shard_prefix(TENANT, uid, 0)) == (
        {},
        {"req-1": MEDIA_OUT_OF_MEMORY},
    )
    # both run again on a new slot: the blamed request is an error line, nothing else is lost
    h.run_jobs()
    for batch in (media, other):
        h.step_until(batch, "completed")
    done = h.status(media)
    assert done["requestCounts"] == {"total": 2, "completed": 1, "failed": 1}
    (error,) = h.file_lines(done["errorFileID"])
    assert error["custom_id"] == "req-1"
    assert error["response"]["body"]["error"]["code"] == MEDIA_OUT_OF_MEMORY
    assert h.status(other)["requestCounts"] == {"total": 2, "completed": 2, "failed": 0}


def test_a_memory_kill_with_no_media_named_or_another_end_keeps_the_usual_rule(
    h: ReconcilerHarness,
) -> None:
    job, media, other = _shared_slot(h)
    _beat(h, job, {media: ["req-1"]})
    _killed(h, job, "Error")  # not a memory kill
    for batch in (media, other):
        lease = lease_of(h, batch)
        assert isinstance(lease, ShardLease)
        assert (lease.attempts, lease.failed_slots) == (1, [job["metadata"]["name"]]), batch
