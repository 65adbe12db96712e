"""The pool scheduler's rounds over warm slots, with the reconciler harness: a slot that stops
heartbeating loses its shards to another within the lease (fenced), a warm slot takes the next
batch without a new engine, preemption takes a standard shard back for an expedited one, and
scale-down drains idle slots."""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter
from typing import Any

import pytest

from llmbatch.api.slot import ShardLease, ShardReport, SlotHeartbeat
from llmbatch.controller import metrics
from llmbatch.controller.pools import ACCEPTED_TTL, QUIET_SECONDS, running_entry
from llmbatch.core import keys
from llmbatch.storage.slotchannel import SlotChannel, fence_lease, read_lease
from tests.fixtures.builders import TENANT, WORKERS, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool(scaleDownCooldownSeconds=0))
    return harness


def submit(h: ReconcilerHarness, name: str, requests: int, **spec: object) -> str:
    file_id = f"file-{name[-32:]:0>32}"
    h.kube.add("batchfiles", make_input_file(h.store, file_id, requests))
    h.kube.add("batches", make_batch(name, input_file_id=file_id, **spec))
    h.step_until(name, "in_progress")
    h.step(name)  # the shard specs: queued
    return name


def channel(h: ReconcilerHarness, slot: str) -> SlotChannel:
    return SlotChannel(h.store, keys.slot_prefix("pool-a", slot))


def beat(h: ReconcilerHarness, slot: str, state: str = "ready", seq: int = 1) -> None:
    """The slot's heartbeat, its assigned shards running."""
    ch = channel(h, slot)
    running = [
        ShardReport(key=k, generation=a.generation, state="running")
        for k, a in ch.assignments().items()
    ]
    ch.write_heartbeat(
        SlotHeartbeat(slot=slot, seq=seq, state=state, started_at=h.now, shards=running)  # type: ignore[arg-type]
    )


def lease_of(h: ReconcilerHarness, name: str, index: int = 0) -> object:
    uid = h.batch(name)["metadata"]["uid"]
    return read_lease(h.store, keys.shard_lease_key(keys.shard_prefix(TENANT, uid, index)))


def test_a_slot_without_heartbeats_loses_its_shards_to_another_fenced(h: ReconcilerHarness) -> None:
    name = submit(h, "batch-" + "a" * 24, requests=2)
    h.pool_round()
    (first,) = h.jobs()
    slot = first["metadata"]["name"]
    beat(h, slot)
    h.pool_round()  # seen alive
    before = lease_of(h, name)
    h.watch(h.config.slot_lease_seconds + 1)  # no new heartbeat since
    assert slot not in [j["metadata"]["name"] for j in h.jobs()]  # its Job is deleted
    (second,) = h.jobs()
    after = lease_of(h, name)
    assert after.slot == second["metadata"]["name"]  # type: ignore[attr-defined]
    # released (a generation the lost slot no longer holds), then granted (another)
    assert after.generation == before.generation + 2  # type: ignore[attr-defined]
    assert after.attempts == 1  # type: ignore[attr-defined]
    assert after.failed_slots == [slot]  # type: ignore[attr-defined]
    h.step(name)
    assert "SlotLost" in h.reasons()
    h.run_jobs()
    status = h.step_until(name, "completed")
    out = h.file_lines(status["outputFileID"])
    assert Counter(line["custom_id"] for line in out) == Counter(["req-0", "req-1"])


def test_a_warm_slot_takes_the_next_batch_without_starting_another(h: ReconcilerHarness) -> None:
    first = submit(h, "batch-" + "b" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    name = slot["metadata"]["name"]
    assert h.run_slot(slot, exits=False).value == "done"
    h.pool_round()  # settles the done report, takes the assignment back
    beat(h, name, seq=2)  # idle and ready, model loaded
    h.pool_round()
    h.step_until(first, "completed")
    second = submit(h, "batch-" + "c" * 24, requests=2)
    h.pool_round()
    assert [j["metadata"]["name"] for j in h.jobs()] == [name]  # no new slot
    assert lease_of(h, second).slot == name  # type: ignore[attr-defined]


def test_expedited_takes_a_standard_shard_back_from_a_full_slot(h: ReconcilerHarness) -> None:
    h.kube.remove("batchpools", None, "pool-a")
    h.kube.add(
        "batchpools",
        make_pool(maxSlots=1, slotConcurrency=1, preemption="LowerPriority"),
    )
    standard = submit(h, "batch-" + "d" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    name = slot["metadata"]["name"]
    beat(h, name)
    first = submit(h, "batch-" + "e" * 24, requests=2, priority="expedited")
    h.pool_round()
    # the first expedited shard takes the full slot's express seat: nothing is taken back
    assert "Preempted" not in h.reasons()
    assert lease_of(h, first).slot == name  # type: ignore[attr-defined]
    beat(h, name, seq=2)
    second = submit(h, "batch-" + "k" * 24, requests=2, priority="expedited")
    h.pool_round()  # the second finds no seat at all: the standard shard is taken back
    assert "Preempted" in h.reasons()
    held = channel(h, name).assignments()
    assert len(held) == 1  # only the first expedited shard is left on the slot
    assert lease_of(h, standard).preemptions == 1  # type: ignore[attr-defined]
    assert lease_of(h, second) is None  # it gets the place once the standard shard has stopped


def test_scale_down_drains_idle_slots(h: ReconcilerHarness) -> None:
    name = submit(h, "batch-" + "f" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    slot_name = slot["metadata"]["name"]
    assert h.run_slot(slot, exits=False).value == "done"
    h.pool_round()
    beat(h, slot_name, seq=2)
    h.pool_round()
    h.step_until(name, "completed")
    for _ in range(3):  # no backlog: desired falls to 0 (no cool-down in this pool)
        h.pool_round()
    assert channel(h, slot_name).drain_requested()
    assert "SlotDrained" in h.reasons()


def edit_pool(h: ReconcilerHarness, **spec: object) -> None:
    """`kubectl edit batchpool pool-a`: the spec changes, the pool (and its uid) stays."""
    pool = h.kube.get("batchpools", None, "pool-a")
    assert pool is not None
    pool["spec"] = make_pool(scaleDownCooldownSeconds=0, **spec)["spec"]


def test_a_pool_edit_retires_the_slots_started_before_it(h: ReconcilerHarness) -> None:
    """A busy slot of the old spec finishes what it runs, gets nothing new and drains; new work
    starts a slot of the new spec; an idle old slot is removed at once; a pool edit that does
    not shape slots (maxSlots) retires nothing."""
    first = submit(h, "batch-" + "g" * 24, requests=2)
    h.pool_round()
    (old,) = h.jobs()
    old_name = old["metadata"]["name"]
    beat(h, old_name)
    edit_pool(h, maxSlots=3)
    h.pool_round()
    assert "SlotOutdated" not in h.reasons()
    edit_pool(
        h, maxSlots=3, executor={"engine": "simulated", "engineArgs": ["--latency-seconds=0.01"]}
    )
    h.pool_round()
    assert channel(h, old_name).drain_requested()  # busy: it drains, finishing its shard
    assert "SlotOutdated" in h.reasons()
    assert lease_of(h, first).slot == old_name  # type: ignore[attr-defined]
    second = submit(h, "batch-" + "h" * 24, requests=2)
    h.pool_round()
    new = [j for j in h.jobs() if j["metadata"]["name"] != old_name]
    assert len(new) == 1  # the new work started a slot of the new spec, not the old one
    assert lease_of(h, second).slot == new[0]["metadata"]["name"]  # type: ignore[attr-defined]
    spec_key = f"{keys.slot_prefix('pool-a', new[0]['metadata']['name'])}/spec.json"
    assert b"latency_seconds" in h.store.get(spec_key)  # the new engine args
    beat(h, new[0]["metadata"]["name"])
    # the old slot ends its shard and reports it; nothing runs there any more: removed
    ch = channel(h, old_name)
    (key,) = ch.assignments()
    assert h.run_slot(old, exits=False).value == "done"
    h.pool_round()
    assert key not in ch.assignments()
    beat(h, old_name, seq=3)
    h.pool_round()
    assert old_name not in [j["metadata"]["name"] for j in h.jobs()]
    for name in (first, second):
        h.run_jobs()
        status = h.step_until(name, "completed")
        out = h.file_lines(status["outputFileID"])
        assert Counter(line["custom_id"] for line in out) == Counter(["req-0", "req-1"])


def test_min_slots_start_before_any_work_and_stay_warm(h: ReconcilerHarness) -> None:
    """minSlots=1: a slot starts with no batch, is marked to outlive its idle time and is
    never scaled down; the first batch goes to it; lowering minSlots lets it go."""
    edit_pool(h, minSlots=1)
    h.pool_round()
    (slot,) = h.jobs()
    name = slot["metadata"]["name"]
    assert channel(h, name).assignments() == {}
    assert "SlotStarted" in h.reasons()
    beat(h, name)
    for _ in range(3):
        h.pool_round()
    assert channel(h, name).keep_requested()
    assert not channel(h, name).drain_requested()
    assert [j["metadata"]["name"] for j in h.jobs()] == [name]  # no second slot
    first = submit(h, "batch-" + "k" * 24, requests=2)
    h.pool_round()
    assert lease_of(h, first).slot == name  # type: ignore[attr-defined]
    edit_pool(h, minSlots=0)
    h.pool_round()
    assert not channel(h, name).keep_requested()


def seen(uid: str, **status: object) -> dict[str, object]:
    """A Batch as a watch event shows it: ``status`` only (a batch of the harness's tenant)."""
    return {"metadata": {"uid": uid, "namespace": TENANT, "name": f"batch-{uid}"}, "status": status}


def test_a_kicked_pool_is_due_a_round_before_its_interval(h: ReconcilerHarness) -> None:
    """A batch with shards never placed kicks its pool (handlers.batch_seen): the pool timer's
    frequent check then runs a round at once instead of at the next reconcile interval."""
    pools = h.pools
    assert pools.due("pool-a")  # never scheduled
    h.pool_round()
    h.now += 0.5
    assert not pools.due("pool-a")  # within the interval, nothing asked for a round
    pools.notice_batch(
        seen("u1", status="in_progress", pool="pool-a", shards=[{"phase": "Running", "job": "s"}])
    )
    assert not pools.due("pool-a")  # every shard placed: no kick
    pools.notice_batch(
        seen("u1", status="in_progress", pool="pool-a", shards=[{"index": 0, "phase": "Pending"}])
    )
    assert pools.due("pool-a")
    h.pool_round()
    h.now += 0.5
    assert not pools.due("pool-a")  # the round that ran after the kick answered it
    h.now += h.config.reconcile_interval
    assert pools.due("pool-a")  # the interval passed


def test_a_loaded_slot_takes_as_many_shards_as_its_heartbeat_says(h: ReconcilerHarness) -> None:
    """The pool sets no slotConcurrency: before its engine loads a slot is assumed to take
    max_num_seqs / 8 (vLLM's default 256: 8); once its heartbeat reports the engine's own
    sizing (the CPU engine runs 32 sequences: 4), it gets no more than that (without a
    queue: ``slotQueue: 0``)."""
    edit_pool(h, maxSlots=1, slotQueue=0)
    first = submit(h, "batch-" + "m" * 24, requests=4)  # 2 shards
    h.pool_round()
    (slot,) = h.jobs()
    name = slot["metadata"]["name"]
    assert len(channel(h, name).assignments()) == 2
    ch = channel(h, name)
    running = [
        ShardReport(key=k, generation=a.generation, state="running")
        for k, a in ch.assignments().items()
    ]
    ch.write_heartbeat(
        SlotHeartbeat(
            slot=name, seq=1, state="ready", started_at=h.now, concurrency=3, shards=running
        )
    )
    second = submit(h, "batch-" + "n" * 24, requests=8)  # 4 shards
    h.pool_round()
    assert len(ch.assignments()) == 3  # 1 more, not 6 more
    assert lease_of(h, second, 0).slot == name  # type: ignore[attr-defined]
    assert lease_of(h, second, 1) is None  # waits: the pool is full
    assert lease_of(h, first, 1).slot == name  # type: ignore[attr-defined]


def test_a_seat_freed_by_an_ended_run_is_filled_in_the_same_round(h: ReconcilerHarness) -> None:
    """The round that settles a shard run the slot reported ended also gives its seat to the
    next shard: a seat turns over in one round, not two."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    name = submit(h, "batch-" + "p" * 24, requests=4)  # 2 shards of 2
    h.pool_round()
    (slot,) = h.jobs()
    assert lease_of(h, name, 1) is None  # one seat: the second shard waits
    slot_name = slot["metadata"]["name"]
    assert h.run_slot(slot, {0}, exits=False).value == "done"
    ch = channel(h, slot_name)
    (key,) = ch.assignments()
    ended = ch.heartbeat().shards  # type: ignore[union-attr]
    assert [(r.key, r.state) for r in ended] == [(key, "done")]
    # the slot lives on, loaded, and reports shard 0 ended
    ch.write_heartbeat(
        SlotHeartbeat(slot=slot_name, seq=5, state="ready", started_at=h.now, shards=ended)
    )
    h.pool_round()
    assert lease_of(h, name, 0).state == "done"  # type: ignore[attr-defined]
    assert lease_of(h, name, 1).slot == slot["metadata"]["name"]  # type: ignore[attr-defined]


def test_a_run_that_ends_after_finalisation_fenced_its_lease_leaves_the_fence(
    h: ReconcilerHarness,
) -> None:
    name = submit(h, "batch-" + "f" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    assert h.run_slot(slot, exits=False).value == "done"  # its heartbeat reports the shard done
    uid = h.batch(name)["metadata"]["uid"]
    lease_key = keys.shard_lease_key(keys.shard_prefix(TENANT, uid, 0))
    assert fence_lease(h.store, lease_key) is not None  # as finalisation would, meanwhile
    h.pool_round()
    lease = lease_of(h, name)
    assert isinstance(lease, ShardLease)
    assert lease.state == "fenced"  # not overwritten with the round's stale "done"
    assert channel(h, slot["metadata"]["name"]).assignments() == {}  # taken back: stale


def test_a_pool_is_due_at_every_check_while_shards_wait_for_a_seat(h: ReconcilerHarness) -> None:
    """A round that leaves shards waiting makes the next check a round too, so a seat a
    finished shard frees is filled within a check (0.5 s), not a reconcile interval."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    submit(h, "batch-" + "w" * 24, requests=2)
    submit(h, "batch-" + "x" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()  # one seat: the second shard waits
    h.now += 0.5
    assert h.pools.due("pool-a")
    h.run_slot(slot, exits=False)  # the first shard done
    h.pool_round()  # settles it and gives the seat to the second: nothing waits
    h.now += 0.5
    assert not h.pools.due("pool-a")


def test_shards_found_waiting_are_not_read_again_while_they_wait(
    h: ReconcilerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long queue costs no store reads per round: a shard found waiting stays waiting until
    this operator grants it, so its lease is read once, not at every round."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    names = [submit(h, "batch-" + c * 24, requests=2) for c in "pqr"]
    h.pool_round()  # the first is placed, two wait
    store = h.pools.slots.store
    reads: list[str] = []
    get, head = store.get, store.head
    monkeypatch.setattr(store, "get", lambda key, *a: reads.append(key) or get(key, *a))
    monkeypatch.setattr(store, "head", lambda key: reads.append(key) or head(key))
    h.pool_round()
    for name in names[1:]:
        uid = h.batch(name)["metadata"]["uid"]
        prefix = keys.shard_prefix(TENANT, uid, 0)
        assert keys.shard_lease_key(prefix) not in reads
        assert keys.shard_spec_key(TENANT, uid, 0) not in reads
    (slot,) = h.jobs()
    h.run_slot(slot, exits=False)
    h.pool_round()  # the seat goes to the next in line, without reading it again either
    assert lease_of(h, names[1]).state == "granted"  # type: ignore[attr-defined]


def test_a_shard_whose_lease_ended_is_not_read_again_while_its_batch_lists_it(
    h: ReconcilerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished shard stays in its batch's status as unfinished until the batch's next step
    folds it (under a burst, finalising waits behind acceptance): its lease, done, is read by
    the round that finds it so, and not by the rounds after (done, failed and fenced leases
    never change again). Once the status shows it finished it leaves the memory."""
    name = submit(h, "batch-" + "e" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    h.run_slot(slot, exits=False)  # the shard done; its batch's status still lists it Pending
    h.pool_round()  # settles the run (the lease done, the assignment revoked), finds it done
    uid = h.batch(name)["metadata"]["uid"]
    lease_key = keys.shard_lease_key(keys.shard_prefix(TENANT, uid, 0))
    store = h.pools.slots.store
    reads: list[str] = []
    get = store.get
    monkeypatch.setattr(store, "get", lambda key, *a: reads.append(key) or get(key, *a))
    for _ in range(3):
        h.now += QUIET_SECONDS  # a full round each time, not a look
        h.pool_round()
    assert lease_key not in reads
    assert lease_of(h, name).state == "done"  # type: ignore[attr-defined]
    h.step(name)  # the batch folds it: finished, completed
    h.pool_round()
    assert h.pools.slots._known_ended.get("pool-a", set()) == set()


def test_a_pool_deleted_during_a_round_keeps_no_slot_that_round_starts(
    h: ReconcilerHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion waits for the round under way, held open here after it listed the slots:
    the slot that round then starts is deleted too, and no round of the pool runs after."""
    submit(h, "batch-" + "d" * 24, requests=2)
    listed, release = asyncio.Event(), asyncio.Event()
    list_jobs = h.kube.list_jobs

    async def held_once(namespace: str, selector: str) -> list[dict[str, object]]:
        found = await list_jobs(namespace, selector)
        if not listed.is_set():
            listed.set()
            await release.wait()
        return found

    monkeypatch.setattr(h.kube, "list_jobs", held_once)

    async def delete_during_round() -> int:
        in_round = asyncio.create_task(h.pool_step())
        await listed.wait()
        removal = asyncio.create_task(h.pool_removal())
        for _ in range(20):
            await asyncio.sleep(0)
        assert not removal.done(), "the deletion did not wait for the round"
        release.set()
        await in_round
        return await removal

    assert asyncio.run(delete_during_round()) == 0
    assert h.jobs() == []
    assert any(c[:2] == ("create", "jobs") for c in h.kube.calls)  # the round did start one
    h.pool_round()
    assert h.jobs() == []


def accepted_batch(uid: str, name: str) -> dict[str, Any]:
    """A batch of pool-a as the reconcile that accepted it sees it (one shard never placed)."""
    return {
        "metadata": {"uid": uid, "namespace": TENANT, "name": name},
        "spec": {},
        "status": {
            "status": "in_progress",
            "pool": "pool-a",
            "shards": [{"index": 0, "phase": "Pending", "requestCount": 2}],
        },
    }


def test_a_pool_deletion_waits_for_its_slot_pods_then_clears_their_channels(
    h: ReconcilerHarness,
) -> None:
    submit(h, "batch-" + "e" * 24, requests=2)
    h.pool_round()
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    beat(h, slot)
    exiting = {
        "metadata": {
            "name": f"{slot}-pod",
            "namespace": WORKERS,
            "labels": dict(job["spec"]["template"]["metadata"]["labels"]),
        }
    }
    h.kube.add("pods", exiting)  # its executor still commits after SIGTERM
    # handed over by the batch handler, not yet in the watch
    h.pools.notice_accepted(accepted_batch("u9", "batch-" + "f" * 24))
    assert asyncio.run(h.pool_removal()) == 1
    assert h.jobs() == []
    assert channel(h, slot).heartbeat() is not None  # the exiting slot may still write it
    h.kube.remove("pods", WORKERS, f"{slot}-pod")
    assert metrics.REGISTRY.get_sample_value("llmbatch_pool_warm_slots", {"pool": "pool-a"}) == 1
    assert asyncio.run(h.pool_removal()) == 0
    assert list(h.store.list(keys.pool_slots_prefix("pool-a"))) == []
    # its gauges go: a last queue depth left behind would keep an alert firing
    for gauge in ("llmbatch_pool_warm_slots", "llmbatch_pool_desired_slots"):
        assert metrics.REGISTRY.get_sample_value(gauge, {"pool": "pool-a"}) is None
    depth = {"pool": "pool-a", "tier": "standard"}
    assert metrics.REGISTRY.get_sample_value("llmbatch_pool_queue_depth_shards", depth) is None
    assert "pool-a" not in h.pools._accepted  # nor batches handed over by the batch handler


def test_a_batch_accepted_here_counts_as_running_until_the_watch_shows_it(
    h: ReconcilerHarness,
) -> None:
    """The batch handler hands a batch it just accepted to its pool at once: under load the
    watch (the index the rounds read) shows it seconds later. The handed-over entry lasts until
    an event shows the batch accepted or later, or it is deleted, or ACCEPTED_TTL passes."""
    pools = h.pools
    batch = accepted_batch("u1", "batch-" + "u" * 24)

    def uids(indexed: list[dict[str, object]]) -> list[object]:
        return [b["metadata"]["uid"] for b in pools.running_batches("pool-a", indexed)]  # type: ignore[index]

    pools.notice_accepted(batch)
    assert uids([]) == ["u1"]
    assert uids(list(running_entry(batch).values())) == ["u1"]  # shown by the index: once
    pools.notice_batch(seen("u1", status="validating"))  # an older event
    assert uids([]) == ["u1"]
    pools.notice_batch(seen("u1", status="in_progress", pool="pool-a"))  # the acceptance
    assert uids([]) == []
    pools.notice_accepted(batch)
    pools.notice_batch(seen("u1"), deleted=True)
    assert uids([]) == []
    pools.notice_accepted(batch)
    h.now += ACCEPTED_TTL + 1
    assert uids([]) == []


def test_a_loaded_slot_queues_what_its_seats_cannot_take_and_starts_it_when_a_seat_frees(
    h: ReconcilerHarness,
) -> None:
    """With the default queue (as deep as the slot runs at once), what no seat takes queues on
    the loaded slot; the slot starts it the moment a seat frees, with no round in between."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    name = submit(h, "batch-" + "q" * 24, requests=8)  # 4 shards of 2
    h.pool_round()
    (slot,) = h.jobs()
    slot_name = slot["metadata"]["name"]
    assert len(channel(h, slot_name).assignments()) == 1  # not loaded yet: no queue
    beat(h, slot_name)
    h.pool_round()
    assert len(channel(h, slot_name).assignments()) == 2  # one seat, one queued
    assert lease_of(h, name, 2) is None  # the rest waits in the pool's queue
    # The slot runs both shards it holds, one after the other, without a round between.
    assert h.run_slot(slot, exits=False).value == "done"
    reports = channel(h, slot_name).heartbeat().shards  # type: ignore[union-attr]
    assert sorted(r.state for r in reports) == ["done", "done"]


def test_queued_shards_go_back_to_the_pool_for_a_free_seat_elsewhere(
    h: ReconcilerHarness,
) -> None:
    """A slot whose seats are free while another holds queued shards and nothing waits draws
    them: the busy slot's queued shards are revoked unstarted and placed on the free seats."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    name = submit(h, "batch-" + "r" * 24, requests=4)  # 2 shards of 2
    h.pool_round()
    (slot,) = h.jobs()
    busy = slot["metadata"]["name"]
    beat(h, busy)
    h.pool_round()
    ch = channel(h, busy)
    started, queued = sorted(ch.assignments())
    assert int(queued.rsplit("-", 1)[1]) == 1  # one seat, one queued
    # The busy slot has started one of the two (its heartbeat says); a second slot comes up.
    ch.write_heartbeat(
        SlotHeartbeat(
            slot=busy,
            seq=2,
            state="ready",
            started_at=h.now,
            concurrency=1,
            shards=[
                ShardReport(
                    key=started, generation=ch.assignments()[started].generation, state="running"
                )
            ],
        )
    )
    edit_pool(h, maxSlots=2, slotConcurrency=1, minSlots=2)
    h.pool_round()
    (idle,) = (j["metadata"]["name"] for j in h.jobs() if j["metadata"]["name"] != busy)
    beat(h, idle)
    before = metrics.SLOT_QUEUE_RETURNS.labels("pool-a")._value.get()
    h.pool_round()  # the free seat draws the queued shard back ...
    assert set(ch.assignments()) == {started}
    assert metrics.SLOT_QUEUE_RETURNS.labels("pool-a")._value.get() == before + 1
    h.pool_round()  # ... and the next round gives it to the free seat, under a new lease
    assert set(channel(h, idle).assignments()) == {queued}
    lease = lease_of(h, name, 1)
    assert lease.slot == idle  # type: ignore[attr-defined]
    assert lease.generation == 2  # type: ignore[attr-defined]


def test_a_waiting_standard_shard_takes_the_queue_place_of_a_flex_one(
    h: ReconcilerHarness,
) -> None:
    """Tier order holds with queues: a flex shard queued on a busy slot goes back to the pool
    unstarted when a standard shard arrives with no room left, and the standard one queues in
    its place (so it starts first)."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    first = submit(h, "batch-" + "a" * 24, requests=2)
    h.pool_round()
    (slot,) = h.jobs()
    slot_name = slot["metadata"]["name"]
    beat(h, slot_name)  # loaded, running the first batch's shard
    flex = submit(h, "batch-" + "f" * 24, requests=2, metadata={"tier": "flex"})
    h.pool_round()
    ch = channel(h, slot_name)

    def held() -> set[str]:
        return {key.rsplit("-", 1)[0] for key in ch.assignments()}

    def uid(name: str) -> str:
        return str(h.batch(name)["metadata"]["uid"])

    assert held() == {uid(first), uid(flex)}  # flex queued behind the running shard
    standard = submit(h, "batch-" + "s" * 24, requests=2)
    h.pool_round()
    assert held() == {uid(first), uid(standard)}  # standard took the flex shard's place
    h.pool_round()  # the flex shard waits in the pool for a place
    assert held() == {uid(first), uid(standard)}


def one_running_one_queued(
    h: ReconcilerHarness, letter: str, ready_at: float | None
) -> tuple[str, dict[str, Any], str]:
    """A one-seat slot running the first of a batch's two shards and holding the second queued
    behind it: (batch, slot Job, the running shard's key)."""
    edit_pool(h, maxSlots=1, slotConcurrency=1)
    name = submit(h, "batch-" + letter * 24, requests=4)  # 2 shards of 2
    h.pool_round()
    (job,) = h.jobs()
    slot = job["metadata"]["name"]
    ch = channel(h, slot)
    (first,) = ch.assignments()
    ch.write_heartbeat(  # the first shard running (its engine loaded at ``ready_at``)
        SlotHeartbeat(
            slot=slot,
            seq=1,
            state="ready",
            started_at=h.now - 10,
            ready_at=ready_at,
            shards=[ShardReport(key=first, generation=1, state="running")],
        )
    )
    h.pool_round()  # the second queues behind it
    assert len(ch.assignments()) == 2
    return name, job, first


def test_a_lost_slot_costs_an_attempt_only_for_the_shards_it_had_started(
    h: ReconcilerHarness,
) -> None:
    """A slot lost with one shard running and one queued (never reported started): the running
    one goes back with an attempt counted (SlotLost), the queued one without."""
    name, _, first = one_running_one_queued(h, "l", ready_at=None)
    h.watch(h.config.slot_lease_seconds + 1)  # no new heartbeat since
    started = lease_of(h, name, int(first.rsplit("-", 1)[1]))
    queued = lease_of(h, name, 1 - int(first.rsplit("-", 1)[1]))
    assert started.attempts == 1  # type: ignore[attr-defined]
    assert queued.attempts == 0  # type: ignore[attr-defined]
    assert queued.reason is None  # type: ignore[attr-defined]


def test_a_failed_slot_costs_what_it_ran_an_attempt_and_gives_back_what_it_held_queued(
    h: ReconcilerHarness,
) -> None:
    """A slot Job that failed with its engine loaded: the shard it ran goes back with one
    attempt and the slot remembered (SlotFailed: a second failed slot under it gives it up),
    the one it held queued goes back unblamed. One whose engine never loaded costs everything
    it held an attempt (test_reconciler: the engine's arguments are refused on any slot)."""
    name, job, first = one_running_one_queued(h, "f", ready_at=h.now - 5)
    h.finish_job(job, failed="OOMKilled")
    h.pool_round()
    ran = lease_of(h, name, int(first.rsplit("-", 1)[1]))
    queued = lease_of(h, name, 1 - int(first.rsplit("-", 1)[1]))
    assert ran.state in ("granted", "released")  # type: ignore[attr-defined]
    assert ran.attempts == 1  # type: ignore[attr-defined]
    assert ran.reason == "SlotFailed"  # type: ignore[attr-defined]
    assert ran.failed_slots == [job["metadata"]["name"]]  # type: ignore[attr-defined]
    assert queued.state in ("granted", "released")  # type: ignore[attr-defined]
    assert queued.generation >= 2  # type: ignore[attr-defined]  # the failed slot's is gone
    assert queued.attempts == 0  # type: ignore[attr-defined]
    assert queued.reason is None  # type: ignore[attr-defined]
    assert queued.failed_slots == []  # type: ignore[attr-defined]
