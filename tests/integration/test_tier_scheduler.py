"""The tier scheduler's seat-taking rule, on vLLM's own request and queue classes (no engine).

The real engine's behaviour (preemption by vLLM, answers once, in tier order) is checked in
test_executor_vllm.py; here the rule itself: which running requests give up their seats, and
how many, before vLLM's own ``schedule()`` runs.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.request_queue import (
    PriorityRequestQueue,
    SchedulingPolicy,
)
from vllm.v1.request import Request, RequestStatus

from llmbatch.executor.engines.tiersched import _TierSeats


class _VllmSide:
    """The parts of vLLM's Scheduler the rule reads and calls, with its preemption recorded."""

    def __init__(self, seats: int, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self.running: list[Request] = []
        self.waiting = PriorityRequestQueue()
        self.max_num_active_reqs = seats
        self.num_waiting_for_streaming_input = 0
        self.prev_step_scheduled_req_ids: set[str] = set()
        self._pause_state = PauseState.UNPAUSED
        self.preempted: list[str] = []
        self.frozen: set[str] = set()

    def _request_blocks_can_be_freed(self, request: Request) -> bool:
        return request.request_id not in self.frozen

    def _preempt_request(self, request: Request, timestamp: float, **kwargs: Any) -> None:
        assert kwargs == {"drop_stale_output": True}
        assert request not in self.running  # vLLM's contract: popped by the caller
        request.status = RequestStatus.PREEMPTED
        self.preempted.append(request.request_id)
        self.waiting.prepend_request(request)

    def schedule(self) -> str:
        return "vllm's step"


class _Scheduler(_TierSeats, _VllmSide):
    pass


def _request(rid: str, priority: int, arrival: float) -> Request:
    return Request(
        rid, [1, 2, 3], SamplingParams(max_tokens=4), None, arrival_time=arrival, priority=priority
    )


def _scheduler(
    running: list[tuple[str, int]],
    waiting: list[tuple[str, int]],
    seats: int = 3,
    policy: SchedulingPolicy = SchedulingPolicy.PRIORITY,
) -> _Scheduler:
    sched = _Scheduler(seats, policy)
    for i, (rid, priority) in enumerate(running):
        request = _request(rid, priority, float(i))
        request.status = RequestStatus.RUNNING
        sched.running.append(request)
        sched.prev_step_scheduled_req_ids.add(rid)
    for i, (rid, priority) in enumerate(waiting):
        sched.waiting.add_request(_request(rid, priority, 100.0 + i))
    return sched


def test_better_waiting_requests_take_the_worst_running_seats() -> None:
    sched = _scheduler(
        running=[("s0", 1), ("f0", 2), ("s1", 1)], waiting=[("s2", 1), ("e0", 0), ("e1", 0)]
    )
    assert sched.schedule() == "vllm's step"
    # the flex one first, then the latest-arrived standard one; the queued standard s2 takes none
    assert sched.preempted == ["f0", "s1"]
    assert [r.request_id for r in sched.running] == ["s0"]
    assert "f0" not in sched.prev_step_scheduled_req_ids
    assert "s0" in sched.prev_step_scheduled_req_ids
    # vLLM's queue now admits the expedited ones first, the preempted ones after the queued s2
    order = [r.request_id for r in sched.waiting]
    assert order == ["e0", "e1", "s1", "s2", "f0"]


def test_free_seats_are_used_before_anything_is_preempted() -> None:
    sched = _scheduler(running=[("s0", 1), ("s1", 1)], waiting=[("e0", 0), ("e1", 0)], seats=3)
    assert sched.give_seats_to_higher_priorities() == 1
    assert sched.preempted == ["s1"]


def test_nothing_is_preempted_for_an_equal_or_worse_priority() -> None:
    sched = _scheduler(running=[("e0", 0), ("s0", 1), ("s1", 1)], waiting=[("s2", 1), ("f0", 2)])
    assert sched.give_seats_to_higher_priorities() == 0
    sched = _scheduler(running=[("s0", 1), ("s1", 1), ("s2", 1)], waiting=[("e0", 0)])
    sched.running[2].priority = 0  # an expedited request holds the worst seat no longer
    sched.running[2].request_id = "e9"
    assert sched.give_seats_to_higher_priorities() == 1
    assert sched.preempted == ["s1"]


def test_blocked_waiting_requests_take_no_seat() -> None:
    sched = _scheduler(running=[("s0", 1), ("s1", 1), ("s2", 1)], waiting=[("e0", 0), ("e1", 0)])
    next(
        r for r in sched.waiting if r.request_id == "e0"
    ).status = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    assert sched.give_seats_to_higher_priorities() == 1
    assert sched.preempted == ["s2"]


def test_a_request_whose_blocks_cannot_be_freed_yet_stops_the_round() -> None:
    sched = _scheduler(running=[("s0", 1), ("s1", 1), ("s2", 1)], waiting=[("e0", 0)])
    sched.frozen.add("s2")
    assert sched.give_seats_to_higher_priorities() == 0
    assert len(sched.running) == 3


def test_fcfs_and_a_paused_engine_are_left_alone() -> None:
    sched = _scheduler(
        running=[("s0", 1), ("s1", 1), ("s2", 1)],
        waiting=[("e0", 0)],
        policy=SchedulingPolicy.FCFS,
    )
    sched.schedule()
    assert sched.preempted == []
    sched = _scheduler(running=[("s0", 1), ("s1", 1), ("s2", 1)], waiting=[("e0", 0)])
    sched._pause_state = PauseState.PAUSED_NEW
    sched.schedule()
    assert sched.preempted == []


def test_the_factory_picks_vllms_base_as_vllm_would() -> None:
    from types import SimpleNamespace

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from llmbatch.executor.engines import tiersched

    built: list[type] = []

    class Probe:
        def __init__(self, **kwargs: Any) -> None:
            built.append(type(self))

    for flag, base in ((True, AsyncScheduler), (False, Scheduler)):
        cls = tiersched.AsyncTierScheduler if flag else tiersched.TierScheduler
        assert issubclass(cls, base)
        config = SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=flag))
        original = cls.__init__
        cls.__init__ = Probe.__init__  # type: ignore[method-assign]
        try:
            tiersched.tier_scheduler(vllm_config=config)
        finally:
            cls.__init__ = original  # type: ignore[method-assign]
    assert built == [tiersched.AsyncTierScheduler, tiersched.TierScheduler]
