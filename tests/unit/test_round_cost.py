"""What a pool round is charged for its pace (#30's burst): its own steps on the loop and its
store calls in threads, not the CPU of what the loop serves while the round waits."""

from __future__ import annotations

import asyncio
import threading

import pytest

from llmbatch.controller.roundcost import RoundCost, counted


class Clock:
    """A CPU clock per thread (as ``RUSAGE_THREAD``), moved by hand: :meth:`spend`."""

    def __init__(self) -> None:
        self._spent: dict[int, float] = {}

    def spend(self, seconds: float) -> None:
        me = threading.get_ident()
        self._spent[me] = self._spent.get(me, 0.0) + seconds

    def __call__(self) -> float:
        return self._spent.get(threading.get_ident(), 0.0)


def test_a_round_is_charged_for_its_own_steps_and_threads_not_for_the_loops_other_work() -> None:
    clock = Clock()
    cost = RoundCost(clock)

    def store_call() -> str:
        clock.spend(4.0)  # the Python part of a store call, in a thread
        return "written"

    async def the_round() -> str:
        clock.spend(1.0)
        await asyncio.sleep(0.01)  # meanwhile the loop serves another task
        loop = asyncio.get_running_loop()
        written = await loop.run_in_executor(None, counted(store_call))
        clock.spend(2.0)
        return written

    async def acceptances() -> None:
        await asyncio.sleep(0.001)
        clock.spend(50.0)

    async def both() -> str:
        other = asyncio.create_task(acceptances())
        result = await cost.measure(the_round())
        await other
        return result

    assert asyncio.run(both()) == "written"
    assert cost.loop == 3.0
    assert cost.threads == 4.0
    assert cost.seconds == 7.0


def test_outside_a_round_a_store_call_is_not_wrapped() -> None:
    def call() -> None:
        return None

    assert counted(call) is call


def test_a_cancelled_round_passes_the_cancellation_through() -> None:
    cost = RoundCost(Clock())
    cleaned: list[str] = []

    async def the_round() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append("yes")

    async def cancel_it() -> None:
        task = asyncio.create_task(cost.measure(the_round()))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert cleaned == ["yes"]
