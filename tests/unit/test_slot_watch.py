"""What a pool round sees of its slots (#31): liveness the operator's blindness cannot fool, slot
pods that never start, messages of a peer of another version, drains and keep marks."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import orjson
import pytest

from llmbatch.api.slot import ShardReport, SlotHeartbeat
from llmbatch.controller import metrics
from llmbatch.controller.pools import QUIET_SECONDS, PoolScheduler
from llmbatch.core import keys
from tests.fixtures.builders import WORKERS, make_pool
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_slot_scheduler import beat, channel, lease_of, submit


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool(scaleDownCooldownSeconds=0))
    return harness


def running_slot(h: ReconcilerHarness, letter: str) -> tuple[str, str]:
    """A batch whose one shard runs on a slot that has sent a heartbeat: (batch, slot)."""
    name = submit(h, "batch-" + letter * 24, requests=2)
    h.pool_round()
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    beat(h, slot)
    h.pool_round()
    return name, slot


def slot_names(h: ReconcilerHarness) -> list[str]:
    return [j["metadata"]["name"] for j in h.jobs()]


def test_time_the_operator_could_not_look_never_makes_a_slot_lost(h: ReconcilerHarness) -> None:
    """#31: a store outage longer than the lease marked every slot lost on the first round
    that read again (the slot could not write a heartbeat either, its runs were fine)."""
    name, slot = running_slot(h, "a")
    h.now += 120  # no round could read the channels for two minutes
    h.pool_round()
    assert slot in slot_names(h)
    assert lease_of(h, name).attempts == 0  # type: ignore[attr-defined]
    beat(h, slot, seq=2)  # the store is back: so is its heartbeat
    h.watch(20)
    assert slot in slot_names(h)
    h.watch(h.config.slot_lease_seconds + 1)  # then silent for a lease of time seen
    assert slot not in slot_names(h)


def stuck_pod(h: ReconcilerHarness, slot: str, reason: str, message: str) -> None:
    h.kube.add(
        "pods",
        {
            "metadata": {
                "name": f"{slot}-x1",
                "namespace": WORKERS,
                "labels": {"llmbatch.io/pool": "pool-a", "llmbatch.io/slot": slot},
            },
            "status": {
                "phase": "Pending",
                "containerStatuses": [
                    {
                        "name": "executor",
                        "state": {"waiting": {"reason": reason, "message": message}},
                    }
                ],
            },
        },
    )


def test_a_slot_whose_pod_never_starts_is_reported_then_removed_without_blame(
    h: ReconcilerHarness,
) -> None:
    name = submit(h, "batch-" + "b" * 24, requests=2)
    h.pool_round()
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    stuck_pod(h, slot, "ImagePullBackOff", 'Back-off pulling image "registry.example/x:1"')
    observer = h.pools.slots.observer
    observer.config = dataclasses.replace(observer.config, slot_start_seconds=120)
    h.watch(40)
    warnings = [e for e in h.events if e[1] == "SlotNotStarting"]
    assert len(warnings) == 1, h.events  # reported once
    assert "ImagePullBackOff" in warnings[0][2]
    on_batch = [e for e in h.kube.events if e["involvedObject"].get("kind") == "Batch"]
    assert [(e["reason"], e["involvedObject"]["name"], e["type"]) for e in on_batch] == [
        ("SlotNotStarting", name, "Warning")
    ]
    h.watch(90)
    assert slot not in slot_names(h)
    assert any(e[1] == "SlotNotStarted" and "ImagePullBackOff" in e[2] for e in h.events)
    lease = lease_of(h, name)
    assert lease.attempts == 0  # type: ignore[attr-defined]
    assert lease.failed_slots == []  # type: ignore[attr-defined]


def test_an_unreadable_heartbeat_is_an_event_and_a_metric_not_a_stalled_round(
    h: ReconcilerHarness,
) -> None:
    name, slot = running_slot(h, "c")
    before = metrics.SLOT_MESSAGES_UNREADABLE.labels("pool-a", "heartbeat")._value.get()
    h.store.put(keys.slot_heartbeat_key(keys.slot_prefix("pool-a", slot)), b'{"seq": "not a n')
    h.watch(10)
    assert slot in slot_names(h)  # alive: its heartbeat object changed
    assert [e for e in h.events if e[1] == "UnreadableMessage"]
    after = metrics.SLOT_MESSAGES_UNREADABLE.labels("pool-a", "heartbeat")._value.get()
    assert after > before
    assert lease_of(h, name).state == "granted"  # type: ignore[attr-defined]  # left as it is


def test_a_shard_report_of_a_newer_executor_is_dropped_not_the_heartbeat(
    h: ReconcilerHarness,
) -> None:
    """An executor one version ahead reports a shard state this operator does not know, and
    fields it has never heard of: the heartbeat is read, the unknown report skipped."""
    name, slot = running_slot(h, "d")
    (key,) = channel(h, slot).assignments()
    beat_json: dict[str, Any] = SlotHeartbeat(
        slot=slot, seq=9, state="ready", started_at=h.now, concurrency=2
    ).model_dump(mode="json")
    beat_json["gpu_temperature"] = 71  # a field from the future
    beat_json["shards"] = [
        {"key": key, "generation": 1, "state": "thermal_throttled", "completed": 1},
        {"key": "other-00000", "generation": 1, "state": "running", "new_field": True},
    ]
    h.store.put(keys.slot_heartbeat_key(keys.slot_prefix("pool-a", slot)), orjson.dumps(beat_json))
    h.pool_round()
    unreadable = [e[2] for e in h.events if e[1] == "UnreadableMessage"]
    assert any("1 unreadable shard reports" in message for message in unreadable)
    assert slot in slot_names(h)
    assert lease_of(h, name).state == "granted"  # type: ignore[attr-defined]


def test_an_unreadable_lease_is_left_alone_and_the_round_goes_on(h: ReconcilerHarness) -> None:
    name, _ = running_slot(h, "e")
    uid = h.batch(name)["metadata"]["uid"]
    lease_key = keys.shard_lease_key(keys.shard_prefix("team-a", uid, 0))
    h.store.put(lease_key, b'{"generation": "x"}')
    h.now += QUIET_SECONDS  # the next round that decides anything reads it
    h.pool_round()
    assert any("cannot be read" in e[2] for e in h.events if e[1] == "UnreadableMessage")
    other = submit(h, "batch-" + "f" * 24, requests=2)  # the pool still places other work
    h.pool_round()
    assert lease_of(h, other).state == "granted"  # type: ignore[attr-defined]


def test_a_slot_asked_to_drain_takes_no_new_shard(h: ReconcilerHarness) -> None:
    """#31: between the drain request and the slot's next heartbeat, placements still went to
    it (a model load elsewhere saved for nothing under a fluctuating backlog)."""
    h.kube.get("batchpools", None, "pool-a")["spec"]["maxSlots"] = 2  # type: ignore[index]
    _, slot = running_slot(h, "g")
    assert not h.pools.slots.fleet.draining
    h.pools.slots.fleet.draining.add(slot)  # as scale-down asks it to
    other = submit(h, "batch-" + "h" * 24, requests=2)
    h.pool_round()
    lease = lease_of(h, other)
    assert lease.slot != slot  # type: ignore[attr-defined]


def test_a_keep_mark_left_by_an_earlier_operator_is_removed_when_not_wanted(
    h: ReconcilerHarness,
) -> None:
    """#31: keep-warm marks were remembered in memory only, so a restarted operator never
    removed the marks its predecessor wrote and those slots never idled out."""
    _, slot = running_slot(h, "i")
    ch = channel(h, slot)
    ch.keep_warm(True)  # written by the operator before this one (minSlots was 1 then)
    h.pools = PoolScheduler(
        h.kube, h.store, h.config, clock=h.clock, cpu_clock=h.clock
    )  # a restarted operator
    h.pool_round()  # minSlots 0
    assert not ch.keep_requested()


def test_heartbeat_reports_that_count_no_attempt_reach_the_lease(h: ReconcilerHarness) -> None:
    name, slot = running_slot(h, "j")
    (key,) = channel(h, slot).assignments()
    channel(h, slot).write_heartbeat(
        SlotHeartbeat(
            slot=slot,
            seq=5,
            state="ready",
            started_at=h.now,
            shards=[
                ShardReport(
                    key=key,
                    generation=1,
                    state="engine_failed",
                    counts_attempt=False,
                    crash_suspects=3,
                    message="engine failed: a crash; 3 requests in the engine run alone next",
                )
            ],
        )
    )
    h.pool_round()
    lease = lease_of(h, name)
    assert (lease.attempts, lease.crashes, lease.reason) == (0, 1, "EngineFailed")  # type: ignore[attr-defined]


def test_a_channel_without_a_slot_job_is_removed_at_the_second_sweep(
    h: ReconcilerHarness,
) -> None:
    """#31: an operator that died between deleting a slot Job and its channel left the channel
    in the store for ever."""
    _, slot = running_slot(h, "k")
    orphan = channel(h, "pool-a-slot-0rphan")
    orphan.write_heartbeat(
        SlotHeartbeat(slot="pool-a-slot-0rphan", seq=1, state="exited", started_at=1.0)
    )

    def alive_for(seconds: float) -> None:  # the live slot heartbeats all along
        for _ in range(int(seconds // 2)):
            h.now += 2
            beat(h, slot, seq=int(h.now))
            h.pool_round()

    alive_for(302)  # the first sweep finds it without a Job
    assert orphan.heartbeat() is not None
    alive_for(302)  # still without one at the next: removed
    assert orphan.heartbeat() is None
    assert slot in slot_names(h)
    assert channel(h, slot).heartbeat() is not None  # a slot with a Job keeps its channel


def test_a_suspended_slot_waits_for_admission_and_its_start_time_counts_from_its_resumption(
    h: ReconcilerHarness,
) -> None:
    """A slot Job created suspended (a pool that Kueue admits) has no pod: it is waiting, not
    failing to start, however long Kueue keeps it; once resumed it has the start bound again."""
    h.kube.add("batchpools", make_pool(executor={"engine": "simulated", "createSuspended": True}))
    name = submit(h, "batch-" + "s" * 24, requests=2)
    h.pool_round()
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    assert job["spec"]["suspend"] is True
    observer = h.pools.slots.observer
    observer.config = dataclasses.replace(observer.config, slot_start_seconds=120)
    h.watch(600)  # five start bounds waiting for admission
    assert slot_names(h) == [slot]
    assert not [e for e in h.events if e[1] in ("SlotNotStarting", "SlotNotStarted")], h.events
    job["spec"]["suspend"] = False  # admitted: Kueue resumes the Job
    h.watch(100)
    assert slot_names(h) == [slot]
    h.watch(30)  # no heartbeat within the start bound after its resumption
    assert slot not in slot_names(h)
    assert lease_of(h, name).attempts == 0  # type: ignore[attr-defined]
