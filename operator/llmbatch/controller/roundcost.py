"""What a pool round takes from the operator's event loop: the user CPU of its own steps on the
loop plus the user CPU of the store calls it runs in threads (Python code: it holds the GIL, so
the loop waits meanwhile). Not the time it waits on those calls, nor their kernel time (fsync,
file I/O: the GIL is released, the loop runs on), nor the CPU of the acceptances and watch
events the loop serves meanwhile: a round measured by the loop's CPU over its whole span was
charged for the burst around it, and one measured with its threads' kernel time for the fsyncs
of its grants (0.15 s of 0.17 under #30's burst); either paced the next round 0.5 s away
exactly while accepted batches waited for their grants (:data:`controller.pools.ROUND_PACE`)."""

from __future__ import annotations

import contextvars
import functools
import resource
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_CURRENT: contextvars.ContextVar[RoundCost | None] = contextvars.ContextVar(
    "llmbatch_round_cost", default=None
)


def user_cpu() -> float:
    """User CPU seconds of the calling thread (Linux: ``RUSAGE_THREAD``)."""
    return resource.getrusage(resource.RUSAGE_THREAD).ru_utime


@dataclass
class RoundCost:
    """CPU seconds one round has used so far, on the loop and in its threads."""

    clock: Callable[[], float]
    """CPU seconds of the calling thread (:func:`user_cpu`; a fake clock in tests)."""
    loop: float = 0.0
    threads: float = 0.0

    @property
    def seconds(self) -> float:
        return self.loop + self.threads

    async def measure(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro``, counting the CPU of each of its steps on this thread; the store
        calls it hands to threads through :func:`counted` count here too (also from the tasks
        it gathers: they inherit this context)."""
        token = _CURRENT.set(self)
        try:
            return await _Stepped(coro, self)
        finally:
            _CURRENT.reset(token)


def counted(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` to run in a thread, its CPU added to the round measuring the caller (if any).
    Call this on the loop: the round is found in the caller's context, which executors do not
    pass on to their threads."""
    cost = _CURRENT.get()
    if cost is None:
        return fn

    @functools.wraps(fn)
    def run(*args: Any) -> T:
        started = cost.clock()
        try:
            return fn(*args)
        finally:
            cost.threads += cost.clock() - started

    return run


class _Stepped(Generic[T]):
    """Drives a coroutine step by step for the event loop (every future it yields passes
    through unchanged), timing each step."""

    def __init__(self, coro: Coroutine[Any, Any, T], cost: RoundCost) -> None:
        self._coro = coro
        self._cost = cost

    def __await__(self) -> Generator[Any, Any, T]:
        value: Any = None
        error: BaseException | None = None
        while True:
            started = self._cost.clock()
            try:
                yielded = self._coro.throw(error) if error is not None else self._coro.send(value)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            finally:
                self._cost.loop += self._cost.clock() - started
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                self._coro.close()
                raise
            except BaseException as exc:  # a cancellation thrown into the round: pass it on
                value, error = None, exc
