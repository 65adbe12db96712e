"""Supervisor components with real processes: a dead component is restarted with a back-off."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from llmbatch.devcluster.components import Backoff, Component, ComponentError
from llmbatch.devcluster.config import ComponentSpec


def test_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    backoff = Backoff(initial=1, cap=5, stable=60)
    delays: list[float] = []
    delay: float | None = None
    for _ in range(5):
        delay = backoff.next(delay, ran=0.5)
        delays.append(delay)
    assert delays == [1, 2, 4, 5, 5]
    assert backoff.next(5, ran=61) == 1


def component(tmp_path: Path, script: str, **spec: object) -> Component:
    return Component(
        ComponentSpec(name="svc", command=["{python}", "-c", script], **spec),  # type: ignore[arg-type]
        env=dict(os.environ),
        template=lambda text: text.format(python=sys.executable),
        logs=tmp_path,
        backoff=Backoff(initial=0.2, cap=0.4, stable=60),
    )


async def wait_for_pid(c: Component, other_than: int | None, timeout: float = 20) -> int:
    deadline = time.monotonic() + timeout
    while c.pid is None or c.pid == other_than:
        assert time.monotonic() < deadline, f"{c.name} not restarted"
        await asyncio.sleep(0.05)
    return c.pid


def test_a_killed_component_is_restarted_and_counted(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    script = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(120)"

    async def scenario() -> tuple[int, list[int]]:
        c = component(tmp_path, script, ready_file=str(ready))
        await c.start()
        c.keep_running()
        pids = [await wait_for_pid(c, None)]
        for _ in range(3):
            os.kill(pids[-1], signal.SIGKILL)
            pids.append(await wait_for_pid(c, pids[-1]))
        restarts = c.restarts
        await c.stop()
        assert c.pid is None
        return restarts, pids

    restarts, pids = asyncio.run(scenario())
    assert restarts == 3
    assert len(set(pids)) == 4
    log = (tmp_path / "svc.log").read_text()
    assert "Traceback" not in log


def test_a_component_that_exits_at_start_fails_the_start(tmp_path: Path) -> None:
    async def scenario() -> None:
        c = component(
            tmp_path, "print('boom'); raise SystemExit(3)", ready_url="http://127.0.0.1:1/"
        )
        await c.start()

    with pytest.raises(ComponentError, match="exited with 3"):
        asyncio.run(scenario())
