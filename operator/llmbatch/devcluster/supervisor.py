"""The dev-cluster supervisor: one process that owns the control plane, the node agent and any
extra component processes (operator, gateway, … as ComponentSpecs).

Run as ``python -m llmbatch.devcluster supervise DIR`` (``llmbatch dev up`` and the test fixtures
do that); it reads ``DIR/config.json`` and reports in ``DIR/status.json``. The node agent is a
component of its own (``python -m llmbatch.devcluster agent DIR``). A component, the node agent
or the control plane that dies is restarted with a back-off while the rest keeps running;
the control plane restarts with ``--keep-state`` (the same etcd data, certificates and port), so
its clients reconnect as to a restarted API server.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbatch.devcluster.components import DEFAULT_BACKOFF, Backoff, Component
from llmbatch.devcluster.config import (
    STATUS_FILE,
    ClusterConfig,
    ComponentSpec,
    read_status,
    write_status,
)
from llmbatch.devcluster.controlplane import ControlPlane, ControlPlaneError
from llmbatch.devcluster.processgroup import unreaped_pids
from llmbatch.devcluster.procs import (
    MARKER_ENV,
    RUN_ENV,
    become_subreaper,
    kill_marked_and_wait,
    reap_children,
    reap_orphans,
    start_time,
)

if TYPE_CHECKING:
    from kubernetes_asyncio import client

log = logging.getLogger(__name__)

__all__ = ["STATUS_FILE", "Supervisor", "supervise"]

NODE_AGENT = "node-agent"  # its name in status.json's components and restarts
AGENT_STOP_GRACE = 30.0  # its pods get SIGTERM, 5 s, SIGKILL
CONTROL_PLANE = "controlplane"
STARTUP_WAIT_SECONDS = 60.0
ORPHAN_REAP_SECONDS = 2.0
WATCHDOG_STOP_SECONDS = 5.0


class Supervisor:
    def __init__(self, cfg: ClusterConfig, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_dir
        self.marker = str(cfg.state_dir)
        self.run_id = uuid.uuid4().hex
        self.backoff = backoff
        self.controlplane = ControlPlane(
            cfg.state_dir,
            binary=cfg.binary,
            extra_args=cfg.controlplane_args,
            marker=self.marker,
        )
        self.components: list[Component] = []
        self.controlplane_restarts = 0
        self.state = "starting"
        self._extra: dict[str, Any] = {}
        self._stop = asyncio.Event()
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._api: client.ApiClient | None = None
        self.started = time.time()

    # -- status.json -----------------------------------------------------------------------

    def _status(self, state: str | None = None, **extra: Any) -> None:
        if state is not None:
            self.state = state
        self._extra.update(extra)
        watchdog = self._watchdog.pid if self._watchdog is not None else None
        write_status(
            self.state_dir,
            state=self.state,
            pid=os.getpid(),
            pid_start=start_time(os.getpid()),
            run=self.run_id,
            watchdog_pid=watchdog,
            watchdog_start=start_time(watchdog) if watchdog is not None else None,
            kubeconfig=str(self.cfg.kubeconfig),
            server=self.controlplane.server,
            controlplane_pid=self.controlplane.pid,
            nodes=[n.name for n in self.cfg.nodes],
            components={c.name: c.pid for c in self.components},
            restarts={CONTROL_PLANE: self.controlplane_restarts}
            | {c.name: c.restarts for c in self.components},
            started=self.started,
            **self._extra,
        )

    def _template(self, text: str) -> str:
        return text.format(
            kubeconfig=self.cfg.kubeconfig,
            state_dir=self.state_dir,
            server=self.controlplane.server or "",
            python=sys.executable,
        )

    # -- main ------------------------------------------------------------------------------

    async def run(self) -> int:
        self._prepare()
        starting = asyncio.create_task(self._start(), name="start")
        stop = asyncio.create_task(self._stop.wait())
        reaper = asyncio.create_task(self._reap_orphans(), name="orphan reaper")
        code = 1
        try:
            await asyncio.wait({starting, stop}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()
                code = await self._serve()
            else:
                log.info("stopped while starting")
                code = 0
        except Exception as err:
            log.exception("dev cluster failed")
            self._status("failed", error=str(err))
        finally:
            stop.cancel()
            reaper.cancel()
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await self._shutdown()
            if code == 0:
                self._status("stopped")
            else:
                previous = read_status(self.state_dir)
                self._status("failed", error=previous.get("error", "see supervisor.log"))
            self._stop_watchdog()
        return code

    async def _start(self) -> None:
        """Control plane, node agent (Ready nodes), the default service account, components."""
        began = time.monotonic()
        self._api = api = await self._start_controlplane()
        await self._start_agent()
        await self._wait_nodes_ready(api, STARTUP_WAIT_SECONDS)
        await self._wait_default_serviceaccount(api, STARTUP_WAIT_SECONDS)
        await self._start_components()
        self._status(
            "ready",
            ready_seconds=round(time.monotonic() - began, 3),
            controlplane_ready_seconds=self.controlplane.ready_seconds,
        )
        log.info("dev cluster ready in %.1fs", time.monotonic() - began)

    def _prepare(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._stop.set)
        become_subreaper()
        # Every process started from here on (control plane, components) inherits the run id.
        os.environ[RUN_ENV] = self.run_id
        # Leftovers of a supervisor that was SIGKILLed: gone (with their ports and files)
        # before this run starts its own.
        kill_marked_and_wait(self.marker)
        self._start_watchdog()
        self._status("starting")

    async def _start_controlplane(self) -> client.ApiClient:
        loop = asyncio.get_running_loop()
        # Import the (slow to import) Kubernetes client while the control plane boots.
        self.controlplane.launch()
        self._status("starting")  # with the control plane's pid
        from llmbatch.devcluster.kubeclient import api_client

        await loop.run_in_executor(None, self.controlplane.wait_ready, self.cfg.start_timeout)
        self._status("starting")
        return await api_client(self.cfg.kubeconfig)

    def _component(self, spec: ComponentSpec) -> Component:
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.cfg.kubeconfig)
        env[MARKER_ENV] = self.marker
        component = Component(
            spec,
            env=env,
            template=self._template,
            logs=self.state_dir / "logs",
            backoff=self.backoff,
            changed=self._status,
        )
        self.components.append(component)
        return component

    async def _start_agent(self) -> None:
        """The node agent: a process of its own, restarted like the components (it registers
        the nodes; the cluster is ready once they are)."""
        agent = self._component(
            ComponentSpec(
                name=NODE_AGENT,
                command=["{python}", "-m", "llmbatch.devcluster", "agent", "{state_dir}"],
                stop_grace=AGENT_STOP_GRACE,
            )
        )
        await agent.start()
        agent.keep_running()

    async def _start_components(self) -> None:
        started = []
        for spec in self.cfg.components:
            component = self._component(spec)
            started.append(component)
            await component.start()
        for component in started:
            component.keep_running()

    async def _serve(self) -> int:
        """Until SIGTERM (0), restarting the control plane whenever it dies."""
        keeper = asyncio.create_task(self._keep_controlplane(), name="control plane")
        stop = asyncio.create_task(self._stop.wait())
        done, _ = await asyncio.wait({stop, keeper}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        if keeper in done:
            keeper.result()  # raises what ended it
        return 0

    async def _keep_controlplane(self) -> None:
        """Restart a dead control plane after a back-off, continuing the same cluster (its etcd
        data, certificates and port), like a static-pod API server restarted by its kubelet."""
        loop = asyncio.get_running_loop()
        delay: float | None = None
        while True:
            await self._wait_controlplane()
            ran = time.monotonic() - self.controlplane.launched_at
            delay = self.backoff.next(delay, ran)
            self.controlplane_restarts += 1
            log.error(
                "the control plane exited with %s after %.1fs; restart %d in %gs",
                self.controlplane.returncode,
                ran,
                self.controlplane_restarts,
                delay,
            )
            self._status()
            await asyncio.sleep(delay)
            self.controlplane.launch(keep_state=True)
            self._status()
            try:
                await loop.run_in_executor(
                    None, self.controlplane.wait_ready, self.cfg.start_timeout
                )
            except ControlPlaneError as err:
                log.error("the restarted control plane failed: %s", err)
                continue
            log.info("control plane restarted in %.1fs", self.controlplane.ready_seconds or 0)
            self._status()

    async def _shutdown(self) -> None:
        self._status("stopping")
        for component in reversed(self.components):
            await component.stop()
        if self._api is not None:
            await self._api.close()
        await asyncio.get_running_loop().run_in_executor(None, self.controlplane.stop)
        kill_marked_and_wait(self.marker, run=self.run_id)
        reap_children()

    # -- the node agent --------------------------------------------------------------------

    async def _wait_nodes_ready(self, api: client.ApiClient, timeout: float) -> None:
        from kubernetes_asyncio import client

        core = client.CoreV1Api(api)
        names = {n.name for n in self.cfg.nodes}
        deadline = time.monotonic() + timeout
        while True:
            nodes = await core.list_node()
            ready = {node.metadata.name for node in nodes.items if _node_ready(node)}
            if names <= ready:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"nodes not ready in {timeout:g}s: {sorted(names - ready)}")
            await asyncio.sleep(0.2)

    async def _wait_default_serviceaccount(self, api: client.ApiClient, timeout: float) -> None:
        from kubernetes_asyncio import client

        core = client.CoreV1Api(api)
        deadline = time.monotonic() + timeout
        while True:
            accounts = await core.list_namespaced_service_account("default")
            if any(sa.metadata.name == "default" for sa in accounts.items):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("default service account not created")
            await asyncio.sleep(0.2)

    # -- the control plane and the watchdog ------------------------------------------------

    async def _reap_orphans(self) -> None:
        """Reap adopted orphans (killed children of exited containers) as they come."""
        while True:
            await asyncio.sleep(ORPHAN_REAP_SECONDS)
            owned = {self.controlplane.pid, self._watchdog.pid if self._watchdog else None}
            reap_orphans(unreaped_pids() | {pid for pid in owned if pid is not None})

    async def _wait_controlplane(self) -> None:
        while self.controlplane.process and self.controlplane.process.poll() is None:
            await asyncio.sleep(0.5)

    def _start_watchdog(self) -> None:
        """A separate process that kills this run's processes once this one is gone (even by
        SIGKILL). It has no marker itself, and its own session; a clean exit ends it first."""
        env = {k: v for k, v in os.environ.items() if k not in (MARKER_ENV, RUN_ENV)}
        argv = ["-m", "llmbatch.devcluster", "watchdog", str(os.getpid()), self.marker]
        self._watchdog = subprocess.Popen(
            [sys.executable, *argv, self.run_id],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    def _stop_watchdog(self) -> None:
        """Everything is stopped: end the watchdog, so that nothing of this run outlives it."""
        if self._watchdog is None:
            return
        self._watchdog.terminate()
        try:
            self._watchdog.wait(WATCHDOG_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self._watchdog.kill()
            self._watchdog.wait()


def _node_ready(node: Any) -> bool:
    taints = {t.key for t in node.spec.taints or []}
    conditions = {c.type: c.status for c in node.status.conditions or []}
    return (
        conditions.get("Ready") == "True"
        and "node.kubernetes.io/not-ready" not in taints
        and "node.kubernetes.io/unreachable" not in taints
    )


def supervise(state_dir: Path, *, components: Sequence[ComponentSpec] = ()) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = ClusterConfig.load(state_dir)
    cfg.components = [*cfg.components, *components]
    return asyncio.run(Supervisor(cfg).run())
