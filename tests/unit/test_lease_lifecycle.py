"""The shard lease's lifecycle (``core.leases``): every transition of the table, and how a run's
end is settled — attempts, the slots that failed under a shard, what costs nothing."""

from __future__ import annotations

import itertools

import pytest

from llmbatch.api.slot import LeaseState, ShardLease
from llmbatch.core.leases import (
    OPEN_STATES,
    TRANSITIONS,
    LeaseEvent,
    RunEnd,
    crash_budget,
    settle,
    transition,
)

STATES: list[LeaseState | None] = [None, "granted", "released", "done", "failed", "fenced"]


def lease(state: LeaseState, **fields: object) -> ShardLease:
    return ShardLease.model_validate({"generation": 4, "slot": "s1", "state": state} | fields)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, LeaseEvent)))
def test_every_event_in_every_state(state: LeaseState | None, event: LeaseEvent) -> None:
    """Allowed transitions raise the generation and leave a slot only on a grant (the last one
    kept as ``ran_on``); the rest are refused. Terminal states (done, failed, fenced) absorb
    every event."""
    before = None if state is None else lease(state)
    after = transition(before, event, slot="s2", now=7.0)
    if (state, event) not in TRANSITIONS:
        assert after is None
        assert state in ("done", "failed", "fenced") or event is not LeaseEvent.GRANT
        return
    assert after is not None
    assert after.state == TRANSITIONS[(state, event)]
    assert after.generation == (0 if before is None else before.generation) + 1
    assert after.slot == ("s2" if event is LeaseEvent.GRANT else "")
    # the slot that ran it stays on record (the batch status names it), never as a fence
    held = "" if before is None else before.slot
    assert after.ran_on == ("s2" if event is LeaseEvent.GRANT else held)


def test_open_states_are_the_grantable_ones() -> None:
    assert frozenset({"granted", "released"}) == OPEN_STATES


def test_done_and_preempted_runs_cost_nothing() -> None:
    running = lease("granted", attempts=1)
    done = settle(running, RunEnd("done", "s1"), backoff_limit=3)
    assert done is not None
    assert (done.state, done.attempts, done.reason) == ("done", 1, None)
    back = settle(running, RunEnd("preempted", "s1"), backoff_limit=3)
    assert back is not None
    assert (back.state, back.attempts) == ("released", 1)
    assert settle(running, RunEnd("lease_lost", "s1"), backoff_limit=3) is None


def test_a_failure_counts_one_attempt_until_the_limit() -> None:
    current = lease("granted")
    for attempt in range(1, 4):
        after = settle(current, RunEnd("store_failed", "s1", "503"), backoff_limit=3)
        assert after is not None
        assert (after.state, after.attempts, after.reason) == ("released", attempt, "StoreFailed")
        current = transition(after, LeaseEvent.GRANT, slot="s1") or current
    gave_up = settle(current, RunEnd("engine_failed", "s1"), backoff_limit=3)
    assert gave_up is not None
    assert gave_up.state == "failed"
    assert "gave up after 4 attempts" in (gave_up.message or "")


def test_a_crash_laid_at_requests_costs_the_shard_no_attempt() -> None:
    after = settle(
        lease("granted"), RunEnd("engine_failed", "s1", counts_attempt=False), backoff_limit=0
    )
    assert after is not None
    assert (after.state, after.attempts, after.reason) == ("released", 0, "EngineFailed")


def test_one_failed_slot_is_a_verdict_on_the_slot_two_on_the_shard() -> None:
    first = settle(lease("granted"), RunEnd("slot_failed", "s1", "OOMKilled"), backoff_limit=3)
    assert first is not None
    assert (first.state, first.attempts, first.failed_slots) == ("released", 1, ["s1"])
    regranted = transition(first, LeaseEvent.GRANT, slot="s2")
    assert regranted is not None
    second = settle(regranted, RunEnd("lost", "s2"), backoff_limit=3)
    assert second is not None
    assert (second.state, second.failed_slots) == ("failed", ["s1", "s2"])
    assert "2 slots failed under it" in (second.message or "")


def test_the_same_slot_failing_twice_is_one_slot() -> None:
    once = lease("granted", failed_slots=["s1"], attempts=1)
    after = settle(once, RunEnd("slot_failed", "s1"), backoff_limit=3)
    assert after is not None
    assert (after.state, after.failed_slots) == ("released", ["s1"])


def test_a_settlement_repeated_on_the_moved_lease_is_refused() -> None:
    """A lost answer retried: the lease moved on (a new generation, released), so the same end
    cannot be recorded twice."""
    once = settle(lease("granted"), RunEnd("store_failed", "s1"), backoff_limit=3)
    assert once is not None
    assert settle(once, RunEnd("store_failed", "s1"), backoff_limit=3) is None


def test_an_engine_that_keeps_crashing_under_a_shard_gives_it_up() -> None:
    """Crashes laid at requests cost no attempt, but a shard under which the engine crashed
    more than its budget is given up; a crash with none of its requests inside costs nothing."""
    current = lease("granted")
    crash = RunEnd("engine_failed", "s1", counts_attempt=False, crash_suspects=2)
    for _ in range(crash_budget(1)):
        after = settle(current, crash, backoff_limit=1)
        assert after is not None
        assert (after.state, after.attempts) == ("released", 0)
        current = transition(after, LeaseEvent.GRANT, slot="s1") or current
    outside = settle(current, RunEnd("engine_failed", "s1", counts_attempt=False), 1)
    assert outside is not None
    assert (outside.state, outside.crashes) == ("released", crash_budget(1))
    gave_up = settle(current, crash, backoff_limit=1)
    assert gave_up is not None
    assert gave_up.state == "failed"
    assert "crashed 5 times" in (gave_up.message or "")
