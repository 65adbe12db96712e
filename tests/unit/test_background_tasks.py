"""Long-lived background tasks run under a supervisor: one that fails is run again after a
backoff, logged and counted, never left dead. The Event recorder met a dropped connection and
posted nothing after it until the operator restarted; here it meets one from a real HTTP server
and the Events recorded after it are posted."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any, cast

import pytest
from kubernetes_asyncio import client

from llmbatch.background import HEALTHY_SECONDS, RESTART_BACKOFF, supervised
from llmbatch.controller import metrics
from llmbatch.controller.batchwork import BatchWork
from llmbatch.controller.kube import Kube

INVOLVED = {
    "apiVersion": "llmbatch.io/v1alpha1",
    "kind": "Batch",
    "namespace": "team-a",
    "name": "batch-" + "e" * 24,
    "uid": "u-1",
}


class DroppingEventServer:
    """A loopback HTTP server in the place of the API server's Event endpoint: it drops the
    connection of its first ``drops`` requests without an answer, answers the rest 201 and
    keeps the reasons of the Events it answered."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.dropped = 0
        self.reasons: list[str] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                if self.dropped < self.drops:
                    self.dropped += 1
                    writer.transport.abort()  # no answer: the connection is gone
                    return
                self.reasons.append(json.loads(body)["reason"])
                answer = b'{"kind":"Event","apiVersion":"v1"}'
                writer.write(
                    b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return


def restarts(task: str) -> float:
    sample = metrics.REGISTRY.get_sample_value(
        "llmbatch_background_task_restarts_total", {"task": task}
    )
    return sample or 0.0


async def wait_for(check: Any, timeout: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if check():
            return True
        await asyncio.sleep(0.02)
    return bool(check())


def test_the_event_recorder_survives_a_dropped_connection() -> None:
    async def go() -> tuple[list[str], int, float]:
        server = DroppingEventServer(drops=1)
        cfg = client.Configuration()
        cfg.host = await server.start()
        kube = Kube(client.ApiClient(configuration=cfg))
        work = BatchWork(
            cast(Any, None), kube, resync_seconds=600, startup_spread_seconds=0
        )  # no batch is queued: only the recorder has work
        before = restarts("event-recorder")
        stop = asyncio.Event()
        running = asyncio.create_task(work.run(1, stop))
        try:
            work.events.record(INVOLVED, "Validated", "accepted", warning=False)
            assert await wait_for(lambda: server.dropped == 1, 5)
            work.events.record(INVOLVED, "Completed", "done", warning=False)
            work.events.record(INVOLVED, "Deleted", "gone", warning=True)
            # posted while the operator runs, not by the flush of a stopping one
            await wait_for(lambda: len(server.reasons) == 3, 10)
            return list(server.reasons), work.events.pending, restarts("event-recorder") - before
        finally:
            stop.set()
            await asyncio.wait({running}, timeout=10)
            await kube.close()
            await server.close()

    reasons, pending, restarted = asyncio.run(go())
    # the Event whose post met the dropped connection is posted again, first
    assert reasons == ["Validated", "Completed", "Deleted"]
    assert pending == 0
    assert restarted == 1


class Counted:
    """A stand-in for a labelled Prometheus counter: what was counted, by label."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def labels(self, task: str) -> Counted:
        self._label = task
        return self

    def inc(self, amount: float = 1) -> None:
        self.counts[self._label] = self.counts.get(self._label, 0) + int(amount)


def test_a_failing_task_is_run_again_after_a_growing_backoff_until_it_returns() -> None:
    runs: list[int] = []
    pauses: list[float] = []
    now = [0.0]

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 4:
            raise ConnectionResetError("dropped")

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    counter = Counted()
    asyncio.run(
        supervised(
            "flaky",
            flaky,
            cast(Any, counter),
            sleep=sleep,
            clock=lambda: now[0],
            rng=random.Random(1),
        )
    )
    assert len(runs) == 4
    assert counter.counts == {"flaky": 3}
    base = RESTART_BACKOFF.base
    jitter = RESTART_BACKOFF.jitter
    for failures, pause in enumerate(pauses, start=1):
        step = base * 2 ** (failures - 1)
        assert step * (1 - jitter) <= pause <= step * (1 + jitter)


def test_a_run_that_lasted_starts_the_backoff_over() -> None:
    runs: list[float] = []
    pauses: list[float] = []
    now = [0.0]

    async def fails_late() -> None:
        runs.append(now[0])
        if len(runs) == 3:
            now[0] += HEALTHY_SECONDS  # this run was healthy for a while, then failed
        if len(runs) < 4:
            raise RuntimeError("boom")

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        now[0] += seconds

    asyncio.run(
        supervised(
            "late", fails_late, cast(Any, Counted()), sleep=sleep, clock=lambda: now[0],
            rng=random.Random(2),
        )
    )  # fmt: skip
    assert pauses[2] <= RESTART_BACKOFF.base * (1 + RESTART_BACKOFF.jitter)
    assert pauses[1] > pauses[2]


def test_cancelling_a_supervised_task_ends_it() -> None:
    async def go() -> None:
        started = asyncio.Event()

        async def forever() -> None:
            started.set()
            await asyncio.sleep(3600)

        task = asyncio.create_task(supervised("forever", forever, cast(Any, Counted())))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
