"""Kubernetes Events of batches, posted off the reconcile path.

A step's Events (``Validated``, ``Completed``, …) are for people reading ``kubectl describe``;
nothing in the system waits for them. Posted inline, each cost its worker a round trip (19 ms
median under a burst of 200 batches) before the batch's shards reached the pool. The recorder
takes them as the step's patch lands and posts them from one task, in order, one at a time: under
a burst they trail the status writes instead of competing with them for the API server. While
new batches wait to be accepted, and a second after (``yield_to``), it holds each Event back
for up to :data:`HOLD_SECONDS`: under the 200-batch burst its posts took the API server's time
from the acceptances' status writes, and the last batches' first results came 0.4-0.7 s later.

Like client-go's event broadcaster the queue is bounded: Events that find it full (an API server
that refuses them for minutes) are dropped and counted, never allowed to grow the operator's
memory; an Event the API server refused is not retried (``KubeClient.post_event``). A post that
fails without an answer (a dropped connection) raises out of :meth:`EventRecorder.run`, which runs
under a supervisor (``llmbatch.background``): it is run again after a backoff and posts the same
Event first, and the Events recorded meanwhile wait in the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from llmbatch.controller import metrics

log = logging.getLogger("llmbatch.controller.events")

#: Events held at most while they wait to be posted (client-go's ``maxQueuedEvents``).
CAPACITY = 1000
#: How long a stopping operator goes on posting what is still held.
FLUSH_ON_STOP_SECONDS = 5.0
#: The longest an Event is held back while more urgent work waits (``yield_to``). At the
#: acceptance rate of a deep backlog (~65 batches/s, 1.65 Events each) about 550 are held.
HOLD_SECONDS = 5.0
#: How often a held-back Event checks whether the urgent work is done.
HOLD_CHECK_SECONDS = 0.05


class EventPoster(Protocol):
    async def post_event(
        self,
        involved: dict[str, str],
        reason: str,
        message: str,
        *,
        warning: bool,
        component: str,
    ) -> bool: ...


@dataclass(frozen=True)
class PendingEvent:
    involved: dict[str, str]
    reason: str
    message: str
    warning: bool
    recorded_at: float = field(default=0.0, compare=False)


class EventRecorder:
    """Events recorded now, posted by :meth:`run` (or :meth:`flush`) in the order recorded."""

    def __init__(
        self,
        kube: EventPoster,
        component: str,
        capacity: int = CAPACITY,
        yield_to: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.component = component
        self.capacity = capacity
        self.yield_to = yield_to
        """Whether more urgent work waits (new batches to accept): :meth:`run` holds back."""
        self.clock = clock
        self._pending: deque[PendingEvent] = deque()
        self._wake = asyncio.Event()

    def record(self, involved: dict[str, str], reason: str, message: str, *, warning: bool) -> None:
        """Hold one Event for posting; when the queue is full the oldest held one is dropped."""
        if len(self._pending) >= self.capacity:
            dropped = self._pending.popleft()
            metrics.EVENTS_DROPPED.inc()
            log.warning(
                "event queue full: dropped %s of %s/%s",
                dropped.reason,
                dropped.involved.get("namespace"),
                dropped.involved.get("name"),
            )
        self._pending.append(PendingEvent(involved, reason, message, warning, self.clock()))
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Post every Event held, oldest first (an Event leaves the queue once posted, so one
        cut short by a cancel is posted by the next flush)."""
        while self._pending:
            await self._post_oldest()

    async def _post_oldest(self) -> None:
        event = self._pending[0]
        await self.kube.post_event(
            event.involved,
            event.reason,
            event.message,
            warning=event.warning,
            component=self.component,
        )
        if self._pending and self._pending[0] is event:  # not dropped meanwhile
            self._pending.popleft()

    async def run(self) -> None:
        """Post Events as they are recorded, until cancelled; each one held back while more
        urgent work waits, for at most :data:`HOLD_SECONDS`."""
        while True:
            self._wake.clear()
            while self._pending:
                await self._hold_back()
                if self._pending:
                    await self._post_oldest()
            await self._wake.wait()

    async def _hold_back(self) -> None:
        while self._pending and self.yield_to is not None and self.yield_to():
            if self.clock() - self._pending[0].recorded_at >= HOLD_SECONDS:
                return
            await asyncio.sleep(HOLD_CHECK_SECONDS)

    async def close(self, seconds: float = FLUSH_ON_STOP_SECONDS) -> None:
        """Post what is still held, for at most ``seconds`` (a stopping operator)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), seconds)
