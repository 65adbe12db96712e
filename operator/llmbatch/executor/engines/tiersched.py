"""vLLM's scheduler, with requests of a higher tier taking the seats of running lower-tier ones.

A warm slot runs the shards of several batches on one engine, and each shard's requests carry
its tier rank as their vLLM priority (expedited 0, standard 1, flex 2). vLLM's ``priority``
policy orders its waiting queue by (priority, arrival) and, when the KV cache runs short,
preempts the lowest-priority running request. It never preempts for a *seat*: with
``max_num_seqs`` requests running, an expedited request waits until a running standard one
finishes, and then decodes in a batch still full of standard requests.

The scheduler built here (:func:`tier_scheduler`, given to vLLM as ``scheduler_cls``) makes room
before each step: while a waiting request has a strictly better priority than the worst running
one and no seat is free, that running request is preempted exactly as vLLM preempts under KV
pressure — its KV blocks are freed and it goes back to the waiting queue with the tokens it has
generated; when a seat frees for it, it is recomputed and goes on decoding. Nothing is aborted,
no request is answered twice, and the shard runner above never notices (its request is simply
slower). Requests of one priority never preempt each other, so a tier's own requests run in
arrival order as before.

vLLM's base class is chosen as vLLM itself would choose it: :class:`AsyncScheduler` when the
config enables async scheduling (GPUs), else :class:`Scheduler` (the CPU platform turns async
scheduling off).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

#: Waiting requests that would be admitted if a seat were free (not blocked on a grammar,
#: remote KV or streaming input).
_ADMISSIBLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


class _TierSeats:
    """The seat-giving step, mixed into vLLM's scheduler classes."""

    policy: Any
    running: list[Any]
    waiting: Any
    max_num_active_reqs: int
    num_waiting_for_streaming_input: int
    prev_step_scheduled_req_ids: set[str]
    _pause_state: Any
    _request_blocks_can_be_freed: Callable[[Any], bool]
    _preempt_request: Callable[..., None]

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.policy == SchedulingPolicy.PRIORITY and self._pause_state == PauseState.UNPAUSED:
            self.give_seats_to_higher_priorities()
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def give_seats_to_higher_priorities(self) -> int:
        """Preempt the worst running requests for waiting ones of a better priority, as many
        as there are such waiting requests beyond the free seats; returns how many."""
        if not self.waiting or not self.running:
            return 0
        # vLLM's Request orders itself as its priority queue does: (priority, arrival, id)
        worst = max(self.running)
        if self.waiting.peek_request().priority >= worst.priority:
            return 0  # the steady state: nothing waiting outranks anything running
        free = self.max_num_active_reqs - len(self.running) - self.num_waiting_for_streaming_input
        preempted = 0
        now = time.monotonic()
        for request in self.waiting:  # best first
            if request.priority >= worst.priority:
                break
            if request.status not in _ADMISSIBLE:
                continue
            if free > 0:
                free -= 1  # a free seat takes it without preempting anything
                continue
            if not self._request_blocks_can_be_freed(worst):
                break
            self.running.remove(worst)
            # As reset_prefix_cache preempts outside the step: the request may resume in this
            # very step (if a better one cannot be scheduled), so any in-flight output of it is
            # dropped and the model runner re-adds it from its full token list.
            self._preempt_request(worst, now, drop_stale_output=True)
            self.prev_step_scheduled_req_ids.discard(worst.request_id)
            preempted += 1
            if not self.running:
                break
            worst = max(self.running)
        return preempted


class TierScheduler(_TierSeats, Scheduler):  # type: ignore[misc]
    """vLLM's synchronous scheduler with tier seats (the CPU platform's)."""


class AsyncTierScheduler(_TierSeats, AsyncScheduler):  # type: ignore[misc]
    """vLLM's async scheduler with tier seats (GPUs, where async scheduling is on)."""


def tier_scheduler(*args: Any, **kwargs: Any) -> Scheduler:
    """What vLLM's engine core calls to build its scheduler (``scheduler_cls``)."""
    config = kwargs["vllm_config"].scheduler_config
    cls = AsyncTierScheduler if config.async_scheduling else TierScheduler
    return cls(*args, **kwargs)
