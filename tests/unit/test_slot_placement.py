"""Placing shards on warm slots (core.slots): pack onto loaded engines first, start a slot only
when none has room and the desired count allows, one model per slot, preemption victims."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch.core.scheduling import QueuedShard
from llmbatch.core.slots import (
    Liveness,
    RunningShard,
    SlotView,
    place,
    preemption_victims,
    saturation,
    seats,
    slot_concurrency,
)


def shard(batch: str, index: int = 0, tier: str = "standard", model: str = "m") -> QueuedShard:
    return QueuedShard(batch=batch, tier=tier, created_at=1.0, shard_index=index, model=model)


def test_the_queue_head_goes_to_a_warm_slot_with_room_before_a_new_slot() -> None:
    slots = [
        SlotView("cold", load=0, capacity=2, ready=False, model="m"),
        SlotView("warm", load=1, capacity=2, ready=True, model="m"),
    ]
    result = place([shard("a"), shard("b"), shard("c")], slots, desired=5, capacity=2)
    assert [(q.batch, s) for q, s in result.assign] == [("a", "warm"), ("b", "cold"), ("c", "cold")]
    assert result.new_slots == []


def test_small_batches_pack_onto_the_fullest_loaded_engine() -> None:
    slots = [SlotView("x", 0, 4, True, model="m"), SlotView("y", 3, 4, True, model="m")]
    result = place([shard("a")], slots, desired=2, capacity=4)
    assert [s for _, s in result.assign] == ["y"]


def test_new_slots_only_up_to_the_desired_count_then_the_rest_waits() -> None:
    result = place([shard(f"b{i}") for i in range(5)], [], desired=2, capacity=2)
    assert [len(g) for g in result.new_slots] == [2, 2]
    assert [q.batch for q in result.waiting] == ["b4"]


def test_a_slot_serves_one_model() -> None:
    slots = [SlotView("m-slot", load=0, capacity=4, ready=True, model="m")]
    result = place([shard("a", model="other")], slots, desired=2, capacity=4)
    assert result.assign == []
    assert [[q.model for q in g] for g in result.new_slots] == [["other"]]


def test_a_draining_slot_takes_nothing_and_does_not_count_as_open() -> None:
    slots = [SlotView("s", load=0, capacity=4, ready=True, open=False, model="m")]
    result = place([shard("a")], slots, desired=1, capacity=4)
    assert result.assign == []
    assert [[q.batch for q in g] for g in result.new_slots] == [["a"]]


def test_an_expedited_shard_takes_the_express_seat_of_a_full_slot_only_when_none_has_room() -> None:
    full = SlotView("full", load=2, capacity=2, ready=True, model="m")
    result = place([shard("s"), shard("e", tier="expedited")], [full], desired=1, capacity=2)
    assert [(q.batch, s) for q, s in result.assign] == [("e", "full")]  # overtakes the wait
    assert [q.batch for q in result.waiting] == ["s"]  # standard work waits for a seat
    # one express seat: a second expedited shard waits (or preempts) like the rest
    result = place([shard(f"e{i}", tier="expedited") for i in range(2)], [full], 1, capacity=2)
    assert [q.batch for q, _ in result.assign] == ["e0"]
    assert [q.batch for q in result.waiting] == ["e1"]
    # a slot with a seat free is used before the express seat of a full one
    roomy = SlotView("roomy", load=0, capacity=2, ready=True, model="m")
    result = place([shard("e", tier="expedited")], [full, roomy], desired=2, capacity=2)
    assert [s for _, s in result.assign] == ["roomy"]
    assert seats(2, "expedited") == 3
    assert seats(2, "standard") == seats(2, "flex") == 2


def _running(batch: str, tier: str, created: float, preemptions: int = 0, model: str = "m") -> Any:
    return RunningShard(
        QueuedShard(batch, tier, created, 0, model=model), f"{batch}-0", preemptions
    )


def test_expedited_takes_back_the_newest_lowest_tier_shards_within_the_limit() -> None:
    running = [
        _running("old", "standard", 1.0),
        _running("new", "standard", 9.0),
        _running("flex", "flex", 5.0),
        _running("tired", "flex", 6.0, preemptions=3),
        _running("exp", "expedited", 1.0),
        _running("other-model", "flex", 7.0, model="x"),
    ]
    waiting = [shard("e1", tier="expedited"), shard("e2", tier="expedited"), shard("s")]
    victims = preemption_victims(waiting, running, max_per_shard=3)
    assert [v.key for v in victims] == ["flex-0", "new-0"]
    # one already taken back and still stopping frees a place: one more victim only
    assert [v.key for v in preemption_victims(waiting, running, 3, stopping=1)] == ["flex-0"]
    assert preemption_victims(waiting, running, 3, stopping=2) == []


def test_concurrency_default() -> None:
    assert slot_concurrency(None, 256) == 8
    assert slot_concurrency(None, 4) == 1
    assert slot_concurrency(3, 256) == 3


def test_a_slot_lapses_after_the_lease_without_a_new_heartbeat() -> None:
    live = Liveness(lease_seconds=30, slack=5)
    for now in range(1000, 1031, 2):
        live.look(now)
        live.beat("s", 7 if now < 1010 else 8, now)  # one new heartbeat at 1010
    for now in range(1032, 1041, 2):
        live.look(now)
    assert not live.lapsed("s", 1040)
    live.look(1042)
    assert live.lapsed("s", 1042)
    assert not live.lapsed("never-started", 5000)  # no heartbeat yet: no lapse


def test_time_the_operator_could_not_read_the_channels_never_counts() -> None:
    """#31: a store outage of 60 s made every slot lost on the first round that read again,
    although their heartbeats could not be written either. Blind time is credited."""
    live = Liveness(lease_seconds=30, slack=5)
    live.look(1000)
    live.beat("s", 1, 1000)
    # rounds fail (the store is down) from 1002 to 1070; the first reading after it:
    live.look(1070)
    live.beat("s", 1, 1070)  # the slot could not write a new one either
    assert not live.lapsed("s", 1070)
    for now in range(1072, 1095, 2):  # rounds every 2 s again
        live.look(now)
    assert not live.lapsed("s", 1094)  # 29 s of time it could see
    live.look(1096)
    assert live.lapsed("s", 1096)  # nothing new for 31 s of time it could see


def test_a_slot_without_a_heartbeat_counts_its_unstarted_time_seen() -> None:
    live = Liveness(lease_seconds=30, slack=5)
    live.look(100)
    live.beat("s", None, 100)
    live.look(102)
    assert live.unstarted("s", 102) == 2
    live.look(200)  # 98 s blind: not counted
    assert live.unstarted("s", 200) == pytest.approx(7)
    live.beat("s", 1, 201)
    assert live.unstarted("s", 201) == 0


def _slot(name: str, load: int, queued: tuple[str, ...] = (), **kw: Any) -> SlotView:
    """A loaded slot of model m running 2 at once with a queue of 2."""
    return SlotView(
        name, load, 2, kw.pop("ready", True), model="m", queued_tiers=queued, queue=2, **kw
    )


def test_what_no_seat_or_new_slot_takes_queues_on_the_least_queued_loaded_slot() -> None:
    slots = [
        _slot("a", 2),
        _slot("b", 3, ("standard",)),
        _slot("loading", 2, ready=False),
    ]
    result = place([shard(f"s{i}") for i in range(4)], slots, desired=3, capacity=2)
    # the fewest queued first (a, a on a tie by name, b), up to capacity + queue; a slot still
    # loading its engine has no queue
    assert [(q.batch, s) for q, s in result.assign] == [("s0", "a"), ("s1", "a"), ("s2", "b")]
    assert [q.batch for q in result.waiting] == ["s3"]
    assert result.take_back == {}


def test_seats_and_new_slots_come_before_any_queue() -> None:
    result = place([shard("a"), shard("b")], [_slot("full", 2)], desired=2, capacity=2)
    assert result.assign == []  # a new slot may start: nothing queues on the full one
    assert [[q.batch for q in g] for g in result.new_slots] == [["a", "b"]]


def test_a_better_tier_takes_the_queue_place_of_a_worse_one() -> None:
    full = _slot("full", 4, ("flex", "standard"))
    result = place([shard("s")], [full], desired=1, capacity=2)
    assert [(q.batch, s) for q, s in result.assign] == [("s", "full")]
    assert result.take_back == {"full": 1}  # the flex shard goes back to the pool
    # the same tier never displaces one already queued
    result = place([shard("f", tier="flex")], [full], desired=1, capacity=2)
    assert result.assign == []
    assert result.take_back == {}
    assert [q.batch for q in result.waiting] == ["f"]


def test_expedited_shards_never_queue_and_queued_ones_leave_the_express_seat_free() -> None:
    # 2 running, 2 queued: the express seat is still free, and the slot starts it first
    busy = _slot("busy", 4, ("standard", "standard"))
    result = place([shard("e0", tier="expedited")], [busy], desired=1, capacity=2)
    assert [(q.batch, s) for q, s in result.assign] == [("e0", "busy")]
    result = place([shard("e1", tier="expedited")], [_slot("x", 3)], desired=1, capacity=2)
    assert result.assign == []  # express seat taken: wait or preempt
    assert result.take_back == {}
    assert [q.batch for q in result.waiting] == ["e1"]
    # shards just granted to free seats are not queued behind anything
    granted = _slot("g", 2, ("standard", "standard"))
    result = place([shard("e2", tier="expedited")], [granted], desired=1, capacity=2)
    assert [s for _, s in result.assign] == ["g"]


def test_queued_shards_are_drawn_back_only_for_free_seats_with_nothing_waiting() -> None:
    busy = _slot("busy", 4, ("standard", "standard"))
    assert place([], [busy, _slot("idle", 0)], 2, 2).take_back == {"busy": 2}
    one = place([shard("w")], [busy, _slot("idle", 0)], 2, 2)
    assert one.take_back == {"busy": 1}  # the waiting one takes one free seat
    two = place([shard("w0"), shard("w1")], [busy, _slot("idle", 0)], 2, 2)
    assert two.take_back == {}  # the waiting ones take both
    assert place([], [busy, _slot("idle", 1)], 2, 2).take_back == {"busy": 1}
    assert place([], [busy, _slot("idle", 0, ready=False)], 2, 2).take_back == {}
    other = SlotView("other", 0, 2, True, model="other")
    assert place([], [busy, other], 2, 2).take_back == {}
    # just granted to free seats of its own slot: it waits for nothing, it stays
    granted = _slot("g", 2, ("standard", "standard"))
    assert place([], [granted, _slot("idle", 0)], 2, 2).take_back == {}


def test_an_expedited_shard_granted_to_the_express_seat_holds_it_before_it_starts() -> None:
    """Two expedited batches a round apart, the second before the slot reports the first
    started: the first holds the express seat (the slot starts it there at once), so the second
    finds no seat and waits for preemption instead of queueing behind the first in the slot."""
    granted = SlotView("s", 2, 1, True, model="m", queued_tiers=("expedited",), queue=1)
    assert granted.waiting_for_seat == []
    result = place([shard("b", tier="expedited")], [granted], desired=1, capacity=1)
    assert result.assign == []
    assert [q.batch for q in result.waiting] == ["b"]
    # a standard shard queued beside a running one still waits for the seat, behind it
    queued = SlotView("s", 2, 1, True, model="m", queued_tiers=("standard",), queue=1)
    assert queued.waiting_for_seat == [1]


# --- what a round that placed nothing proves (#30) -------------------------------------------


def test_a_placement_that_left_a_tier_waiting_holds_new_shards_of_that_tier_or_worse() -> None:
    """A full slot with no queue: the standard shard waits, and so would any new standard or
    flex shard of its model; not an expedited one (the express seat), not another model's."""
    full = [SlotView("s", load=1, capacity=1, ready=True, model="m", queue=0)]
    result = place([shard("a")], full, desired=1, capacity=1)
    proved = saturation(result)
    assert proved is not None
    assert proved.holds(shard("b"))
    assert proved.holds(shard("c", tier="flex"))
    assert not proved.holds(shard("d", tier="expedited"))
    assert not proved.holds(shard("e", model="other"))


def test_a_waiting_flex_shard_does_not_hold_a_standard_one() -> None:
    """A standard shard may take the place of a queued flex one: flex waiting proves nothing
    about it."""
    queued = [
        SlotView("s", load=2, capacity=1, ready=True, model="m", queued_tiers=("flex",), queue=1)
    ]
    result = place([shard("a", tier="flex")], queued, desired=1, capacity=1)
    proved = saturation(result)
    assert proved is not None
    assert proved.holds(shard("b", tier="flex"))
    assert not proved.holds(shard("c"))
    assert place([shard("c")], queued, desired=1, capacity=1).take_back == {"s": 1}


def test_a_placement_that_placed_anything_or_left_only_expedited_waiting_proves_nothing() -> None:
    room = [SlotView("s", load=0, capacity=1, ready=True, model="m", queue=0)]
    assert saturation(place([shard("a"), shard("b")], room, desired=1, capacity=1)) is None
    full = [SlotView("s", load=2, capacity=1, ready=True, model="m", queue=0)]
    express_taken = place([shard("x", tier="expedited")], full, desired=1, capacity=1)
    assert [q.batch for q in express_taken.waiting] == ["x"]
    assert saturation(express_taken) is None
    assert saturation(place([], full, desired=1, capacity=1)) is None
