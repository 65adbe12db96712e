"""The supervisor's extra processes (operator, gateway, …): started in order once the cluster is
ready, and kept running like the Deployments they stand for — a component that dies is restarted
after an exponential back-off (logged and counted) while the rest keep serving."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from llmbatch.devcluster.config import ComponentSpec
from llmbatch.devcluster.controlplane import tail
from llmbatch.devcluster.processgroup import ProcessGroup
from llmbatch.devcluster.procs import die_with_parent

log = logging.getLogger(__name__)

READY_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Backoff:
    """Restart delays: ``initial`` doubling up to ``cap``; back to ``initial`` once a run lasted
    ``stable`` seconds (a kubelet: 10 s doubling to 5 min, reset after 10 min)."""

    initial: float = 1.0
    cap: float = 30.0
    stable: float = 60.0

    def next(self, previous: float | None, ran: float) -> float:
        if previous is None or ran >= self.stable:
            return self.initial
        return min(previous * 2, self.cap)


DEFAULT_BACKOFF = Backoff()


class ComponentError(RuntimeError):
    """A component did not come up (exited or not ready in time) at the cluster's start."""


class Component:
    """One component process, restarted whenever it dies until :meth:`stop`."""

    def __init__(
        self,
        spec: ComponentSpec,
        *,
        env: Mapping[str, str],
        template: Callable[[str], str],
        logs: Path,
        backoff: Backoff = DEFAULT_BACKOFF,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.spec = spec
        self.env = env
        self.template = template
        self.log_path = logs / f"{spec.name}.log"
        self.backoff = backoff
        self.changed = changed
        """Called when the pid or the restart count changes (the supervisor rewrites its status)."""
        self.proc: ProcessGroup | None = None
        self.restarts = 0
        self.last_exit: int | None = None
        self._stopping = False
        self._spawned = 0.0
        self._keeper: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def _spawn(self) -> ProcessGroup:
        env = dict(self.env)
        env.update({k: self.template(v) for k, v in self.spec.env.items()})
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            proc = ProcessGroup.spawn(
                [self.template(a) for a in self.spec.command],
                env=env,
                cwd=self.spec.cwd,
                output=out,
                preexec_fn=partial(die_with_parent, signal.SIGTERM),
            )
        self.proc = proc
        self._spawned = time.monotonic()
        self.changed()
        return proc

    async def start(self) -> None:
        """Start the process and wait until it is ready; ComponentError when it is not."""
        proc = self._spawn()
        deadline = time.monotonic() + self.spec.ready_timeout
        while not await self.is_ready():
            if proc.has_exited():
                code = await proc.wait()
                raise ComponentError(
                    f"component {self.name} exited with {code}:\n{tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise ComponentError(
                    f"component {self.name} not ready in {self.spec.ready_timeout:g}s"
                )
            await asyncio.sleep(READY_POLL_SECONDS)

    async def is_ready(self) -> bool:
        spec = self.spec
        if spec.ready_file and Path(self.template(spec.ready_file)).exists():
            return True
        if spec.ready_url:
            return await http_ok(self.template(spec.ready_url))
        return not spec.ready_file

    def keep_running(self) -> None:
        """From now on a process that exits is restarted (after a back-off)."""
        self._keeper = asyncio.create_task(self._keep(), name=f"component {self.name}")

    async def _keep(self) -> None:
        delay: float | None = None
        while not self._stopping:
            proc = self.proc if self.proc is not None else self._spawn()
            code = await proc.wait()
            if self._stopping:
                return
            ran = time.monotonic() - self._spawned
            delay = self.backoff.next(delay, ran)
            self.restarts += 1
            self.last_exit = code
            self.proc = None
            log.error(
                "component %s exited with %s after %.1fs; restart %d in %gs (log %s)",
                self.name,
                code,
                ran,
                self.restarts,
                delay,
                self.log_path,
            )
            self.changed()
            await asyncio.sleep(delay)

    async def stop(self) -> None:
        """SIGTERM to the process group, ``stop_grace``, SIGKILL; no more restarts."""
        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        proc.signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), self.spec.stop_grace)
        except TimeoutError:
            proc.signal(signal.SIGKILL)
            await proc.wait()


async def http_ok(url: str) -> bool:
    """A plain HTTP GET answered 2xx or 3xx."""
    parsed = urllib.parse.urlsplit(url)
    host = parsed.hostname or "127.0.0.1"
    port = parsed.port or 80
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
    except (OSError, TimeoutError):
        return False
    try:
        path = parsed.path or "/"
        writer.write(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 2)
        parts = line.split()
        return len(parts) >= 2 and parts[1][:1] in (b"2", b"3")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()
