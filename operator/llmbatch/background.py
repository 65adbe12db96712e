"""Long-lived background tasks of the operator and the gateway, each run under a supervisor.

A task started with a bare ``asyncio.create_task`` that raises is gone, and nothing notices:
the Event recorder met one dropped connection and every Event after it was lost until the
operator restarted. :func:`supervise` runs a task's coroutine again whenever it raises, after an
exponential backoff with jitter (``core.workqueue.Backoff``, the work queue's), logs the error
with the task's name and counts the restart in the component's metric (``task`` label: the
task's name, a fixed set). A run that lasted :data:`HEALTHY_SECONDS` starts the backoff over.

A coroutine that returns has finished its work (its stop was asked for) and is not run again;
cancelling the supervised task cancels the run in progress.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from llmbatch.core.workqueue import Backoff

log = logging.getLogger("llmbatch.background")

#: The pause before the first restart, doubling per failure in a row up to 30 s.
RESTART_BACKOFF = Backoff(base=0.5, cap=30.0, jitter=0.2)
#: A run at least this long was healthy: the next failure starts the backoff over.
HEALTHY_SECONDS = 60.0


async def supervised(
    name: str,
    run: Callable[[], Awaitable[None]],
    restarts: Counter,
    *,
    backoff: Backoff = RESTART_BACKOFF,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> None:
    """Await ``run()`` until it returns, running it again after each exception
    (``restarts``: a counter with a ``task`` label, in the component's own registry)."""
    rng = rng or random.Random()
    failures = 0
    while True:
        began = clock()
        try:
            await run()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            failures = 1 if clock() - began >= HEALTHY_SECONDS else failures + 1
            delay = backoff.delay(failures, rng)
            restarts.labels(name).inc()
            log.exception("background task %s failed; restarting it in %.1f s", name, delay)
        await sleep(delay)


def supervise(
    name: str, run: Callable[[], Awaitable[None]], restarts: Counter
) -> asyncio.Task[None]:
    """Start ``run`` as a task named ``name`` under :func:`supervised`."""
    return asyncio.create_task(supervised(name, run, restarts), name=name)


async def stop(*tasks: asyncio.Task[None] | None) -> None:
    """Cancel ``tasks`` and wait until they have ended (None entries are skipped)."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
