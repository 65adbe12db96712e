"""Run one pod as local processes, the way a kubelet runs its containers: init containers in order,
then the rest together, restarts by ``restartPolicy``, deadline, graceful deletion.

Images are ignored: a container runs its ``command`` + ``args`` on this machine, in its own process
group. The environment comes from :mod:`podenv`, probes from :mod:`probes`, the reported status
from :mod:`podstatus`. See docs/devcluster.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

from llmbatch.devcluster.containers import Container, exit_code, termination_message
from llmbatch.devcluster.podcontext import (
    JSON,
    ContainerConfigError,
    PodContext,
    now_rfc3339,
)
from llmbatch.devcluster.podenv import Launch, PodEnvironment
from llmbatch.devcluster.podstatus import PodState, StatusPublisher
from llmbatch.devcluster.probes import run_readiness
from llmbatch.devcluster.processgroup import ProcessGroup
from llmbatch.devcluster.procs import die_with_parent

log = logging.getLogger(__name__)

__all__ = ["PodContext", "PodRunner"]

DEFAULT_GRACE_SECONDS = 30.0
CONFIG_RETRY_SECONDS = 2.0  # CreateContainerConfigError: look for the Secret again after this
KILL_WAIT_SECONDS = 10.0  # after SIGKILL, how long to wait for a container to be reaped


def pod_directory(pods_dir: Path, meta: JSON) -> Path:
    """Where a pod's files (logs, termination messages) live, from its metadata."""
    return pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"


class PodRunner:
    """Runs one pod to its end (or until deleted) and keeps its status current."""

    def __init__(self, pod: JSON, ctx: PodContext) -> None:
        self.pod = pod
        self.ctx = ctx
        meta = pod["metadata"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.uid: str = meta["uid"]
        spec = pod["spec"]
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.directory = pod_directory(ctx.pods_dir, meta)
        self.state = PodState(
            init_containers=[
                Container(c, True, self.directory / c["name"])
                for c in spec.get("initContainers") or []
            ],
            containers=[
                Container(c, False, self.directory / c["name"])
                for c in spec.get("containers") or []
            ],
        )
        self.state.initialized = not self.state.init_containers
        self.started_monotonic = time.monotonic()
        self.deleted = False
        self.publisher = StatusPublisher(
            ctx.write_status, self.namespace, self.name, self.state.status
        )
        self._stop_requested = asyncio.Event()
        self._stop_grace = DEFAULT_GRACE_SECONDS
        self.task: asyncio.Task[None] | None = None

    @property
    def init_containers(self) -> list[Container]:
        return self.state.init_containers

    @property
    def containers(self) -> list[Container]:
        return self.state.containers

    def status(self) -> JSON:
        """The pod status as it would be published now."""
        return self.state.status()

    # -- control from the node agent ------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")

    def update(self, pod: JSON) -> None:
        """A newer version of the pod object arrived from the watch."""
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.state.stopping:
            grace = meta.get("deletionGracePeriodSeconds")
            self.request_stop(
                float(grace) if grace is not None else DEFAULT_GRACE_SECONDS, deleted=True
            )

    def request_stop(self, grace: float, *, deleted: bool = False) -> None:
        self.deleted = self.deleted or deleted
        if self._stop_requested.is_set():
            self._stop_grace = min(self._stop_grace, grace)
            return
        self._stop_grace = grace
        self._stop_requested.set()

    def forget(self) -> None:
        """The pod object is gone from the API: kill now, write nothing more."""
        self.publisher.gone = True
        self.request_stop(0.0, deleted=True)

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()

    @property
    def _stopping(self) -> bool:
        return self.state.stopping or self._stop_requested.is_set()

    # -- the pod ---------------------------------------------------------------------------

    async def _run(self) -> None:
        publisher = asyncio.create_task(self.publisher.run())
        deadline = asyncio.create_task(self._deadline())
        try:
            await self._lifecycle()
        except Exception:
            log.exception("pod %s/%s: runner failed", self.namespace, self.name)
            self.state.reason = self.state.reason or "NodeAgentError"
        finally:
            deadline.cancel()
            self._kill_all(signal.SIGKILL)
            await self._reap_all()
            self.publisher.mark_dirty()
            await asyncio.sleep(0)
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
            if not self.publisher.gone:
                await self.publisher.publish()
                if self.deleted:
                    await self.ctx.delete_pod(self.namespace, self.name, self.uid)

    async def _lifecycle(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.publisher.mark_dirty()
        stop_wait = asyncio.create_task(self._stop_requested.wait())
        tasks: list[asyncio.Task[bool]] = []
        try:
            for c in self.init_containers:
                task = asyncio.create_task(self._supervise(c))
                tasks = [task]
                await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():
                    await self._terminate(tasks)
                    return
                if not task.result():
                    if not self._stopping:
                        self.state.failed_init = True
                    return
            self.state.initialized = True
            self.publisher.mark_dirty()
            if self._stop_requested.is_set():
                return
            tasks = [asyncio.create_task(self._supervise(c)) for c in self.containers]
            pending: set[asyncio.Task[Any]] = {*tasks, stop_wait}
            while pending - {stop_wait}:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if stop_wait in done:
                    break
            if stop_wait.done() and not all(t.done() for t in tasks):
                await self._terminate(tasks)
        finally:
            stop_wait.cancel()
            for t in tasks:
                if not t.done():
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _terminate(self, tasks: list[asyncio.Task[bool]]) -> None:
        """Kubelet-style kill: SIGTERM to every container's process group, then SIGKILL."""
        self.state.stopping = True
        grace = self._stop_grace
        if any(c.alive for c in self.state.all_containers):
            await self.ctx.record_event(
                self.pod, "Normal", "Killing", f"Stopping containers (grace {grace:g}s)"
            )
        self._kill_all(signal.SIGTERM)
        self.publisher.mark_dirty()
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=max(grace, 0.0))
            if still:
                self._kill_all(signal.SIGKILL)
                await asyncio.wait(still, timeout=KILL_WAIT_SECONDS)

    def _kill_all(self, sig: int) -> None:
        # Container.signal never reaches a reaped process: its pid may belong to another one.
        for c in self.state.all_containers:
            c.signal(sig)

    async def _reap_all(self) -> None:
        """Collect containers whose waiting task was cancelled (after SIGKILL, so promptly)."""
        procs = [c.proc for c in self.state.all_containers if c.alive and c.proc is not None]
        if procs:
            await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in procs], timeout=KILL_WAIT_SECONDS
            )

    async def _deadline(self) -> None:
        seconds = self.pod["spec"].get("activeDeadlineSeconds")
        if seconds is None:
            return
        await asyncio.sleep(max(0.0, float(seconds) - (time.monotonic() - self.started_monotonic)))
        if self._stopping:
            return
        self.state.reason = "DeadlineExceeded"
        self.state.message = "Pod was active on the node longer than the specified deadline"
        await self.ctx.record_event(self.pod, "Normal", "DeadlineExceeded", self.state.message)
        grace = self.pod["spec"].get("terminationGracePeriodSeconds")
        self.request_stop(float(grace) if grace is not None else DEFAULT_GRACE_SECONDS)

    # -- one container ---------------------------------------------------------------------

    def _should_restart(self, c: Container, code: int) -> bool:
        if self._stopping or self.restart_policy == "Never":
            return False
        if c.init:
            return code != 0  # a failed init container is retried unless the policy is Never
        return self.restart_policy == "Always" or code != 0

    async def _supervise(self, c: Container) -> bool:
        """Run a container, restarting it as the policy says; True when it ended with exit 0."""
        backoff = 1.0
        while True:
            if self._stopping:
                c.state = {"terminated": c.state.get("terminated") or _never_ran()}
                c.done = True
                self.publisher.mark_dirty()
                return False
            try:
                code = await self._run_once(c)
            except ContainerConfigError as err:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
                self.publisher.mark_dirty()
                await self._sleep_or_stop(CONFIG_RETRY_SECONDS)
                continue
            if not self._should_restart(c, code):
                c.done = True
                self.publisher.mark_dirty()
                return code == 0
            # Restart after a back-off (kubelet: 10s doubling to 5min; here 1s doubling to 10s).
            c.last_state = c.state
            c.restart_count += 1
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:g}s restarting failed container={c.name}",
                }
            }
            self.publisher.mark_dirty()
            await self._sleep_or_stop(backoff)
            backoff = min(backoff * 2, self.ctx.restart_backoff_max)

    async def _sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), timeout=seconds)

    async def _run_once(self, c: Container) -> int:
        """Start the container's process and wait for it; its exit code."""
        c.directory.mkdir(parents=True, exist_ok=True)
        containers = [*self.containers, *self.init_containers]
        launch = await PodEnvironment(self.pod, self.ctx, self.directory, containers).launch(c)
        c.termination_file.unlink(missing_ok=True)
        c.termination_file.touch()
        started = now_rfc3339()
        proc = self._spawn(c, launch, started)
        if proc is None:
            return 128
        c.proc = proc
        c.ever_started = True
        # Not ready until the probe says so, also after a restart (a kubelet resets it too).
        c.probe_ready = "readinessProbe" not in c.spec
        c.state = {"running": {"startedAt": started}}
        await self.ctx.record_event(
            self.pod, "Normal", "Started", f"Started container {c.name} (pid {proc.pid})"
        )
        self.publisher.mark_dirty()
        probe = c.spec.get("readinessProbe")
        prober = (
            asyncio.create_task(run_readiness(c, probe, self.publisher.mark_dirty))
            if probe
            else None
        )
        try:
            # Like a container's PID namespace: when the main process ends, the rest of its
            # group goes too (ProcessGroup kills it before reaping the main process).
            returncode = await proc.wait()
        finally:
            if prober is not None:
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober
        return self._terminated(c, returncode, started)

    def _spawn(self, c: Container, launch: Launch, started: str) -> ProcessGroup | None:
        """The container's process; None (and a StartError state) when it cannot be started."""
        with c.log_file().open("ab") as out:
            try:
                return ProcessGroup.spawn(
                    launch.argv,
                    env=launch.env,
                    cwd=launch.cwd,
                    output=out,
                    preexec_fn=die_with_parent,
                )
            except OSError as err:
                out.write(f"failed to start {launch.argv!r}: {err}\n".encode())
                c.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": f"failed to start container process: {err}",
                        "startedAt": started,
                        "finishedAt": now_rfc3339(),
                    }
                }
                self.publisher.mark_dirty()
                return None

    def _terminated(self, c: Container, returncode: int, started: str) -> int:
        """Record the ended run of ``c``; its exit code."""
        code = exit_code(returncode)
        terminated: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now_rfc3339(),
            "containerID": f"process://{c.proc.pid if c.proc else 0}",
        }
        if returncode < 0:
            terminated["signal"] = -returncode
        message = termination_message(c, code, c.log_file())
        if message:
            terminated["message"] = message
        c.state = {"terminated": terminated}
        self.publisher.mark_dirty()
        return code


def _never_ran() -> JSON:
    return {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": "never started"}
