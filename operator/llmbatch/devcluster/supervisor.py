"""The dev-cluster supervisor: one process that owns the control plane, the node agent and any
extra component processes (operator, gateway, … added by later features as ComponentSpecs).

Run as ``python -m llmbatch.devcluster supervise --state-dir DIR`` (``llmbatch dev up`` and the test
fixtures do that); it reads ``DIR/config.json`` and reports in ``DIR/status.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmbatch.devcluster.config import (
    STATUS_FILE,
    ClusterConfig,
    ComponentSpec,
    read_status,
    write_status,
)
from llmbatch.devcluster.controlplane import ControlPlane, tail
from llmbatch.devcluster.procs import (
    MARKER_ENV,
    become_subreaper,
    die_with_parent,
    kill_marked,
    reap_children,
    signal_group,
)

if TYPE_CHECKING:
    from kubernetes_asyncio import client

log = logging.getLogger(__name__)

__all__ = ["STATUS_FILE", "Supervisor", "supervise"]


class Supervisor:
    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        self.state_dir = cfg.state_dir
        self.marker = str(cfg.state_dir)
        self.controlplane = ControlPlane(
            cfg.state_dir,
            binary=cfg.binary,
            extra_args=cfg.controlplane_args,
            marker=self.marker,
        )
        self.components: dict[str, asyncio.subprocess.Process] = {}
        self._stop = asyncio.Event()
        self.started = time.time()

    def _status(self, state: str, **extra: Any) -> None:
        write_status(
            self.state_dir,
            state=state,
            pid=os.getpid(),
            kubeconfig=str(self.cfg.kubeconfig),
            server=self.controlplane.server,
            controlplane_pid=self.controlplane.pid,
            nodes=[n.name for n in self.cfg.nodes],
            components={name: p.pid for name, p in self.components.items()},
            started=self.started,
            **extra,
        )

    def _template(self, text: str) -> str:
        return text.format(
            kubeconfig=self.cfg.kubeconfig,
            state_dir=self.state_dir,
            server=self.controlplane.server or "",
            python=sys.executable,
        )

    async def _start_component(self, spec: ComponentSpec) -> None:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.cfg.kubeconfig)
        env[MARKER_ENV] = self.marker
        env.update({k: self._template(v) for k, v in spec.env.items()})
        with (logs / f"{spec.name}.log").open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                *[self._template(a) for a in spec.command],
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=spec.cwd,
                start_new_session=True,
                preexec_fn=partial(die_with_parent, signal.SIGTERM),
            )
        self.components[spec.name] = proc
        deadline = time.monotonic() + spec.ready_timeout
        while spec.ready_url or spec.ready_file:
            if spec.ready_file and Path(self._template(spec.ready_file)).exists():
                break
            if spec.ready_url and await _http_ok(self._template(spec.ready_url)):
                break
            if proc.returncode is not None:
                raise RuntimeError(
                    f"component {spec.name} exited with {proc.returncode}:\n"
                    + tail(logs / f"{spec.name}.log")
                )
            if time.monotonic() > deadline:
                raise RuntimeError(f"component {spec.name} not ready in {spec.ready_timeout:g}s")
            await asyncio.sleep(0.2)

    async def _stop_components(self) -> None:
        specs = {c.name: c for c in self.cfg.components}
        for name in reversed(list(self.components)):
            proc = self.components[name]
            if proc.returncode is not None:
                continue
            signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), specs[name].stop_grace if name in specs else 10)
            except TimeoutError:
                signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()

    async def _wait_nodes_ready(self, api: client.ApiClient, timeout: float) -> None:
        from kubernetes_asyncio import client

        core = client.CoreV1Api(api)
        names = {n.name for n in self.cfg.nodes}
        deadline = time.monotonic() + timeout
        while True:
            nodes = await core.list_node()
            ready = set()
            for node in nodes.items:
                taints = {t.key for t in node.spec.taints or []}
                conditions = {c.type: c.status for c in node.status.conditions or []}
                if (
                    conditions.get("Ready") == "True"
                    and "node.kubernetes.io/not-ready" not in taints
                    and "node.kubernetes.io/unreachable" not in taints
                ):
                    ready.add(node.metadata.name)
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

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, self._stop.set)
        become_subreaper()
        kill_marked(self.marker)  # leftovers of a supervisor that was SIGKILLed
        self._start_watchdog()
        self._status("starting")
        began = time.monotonic()
        agent_task: asyncio.Task[None] | None = None
        api: client.ApiClient | None = None
        code = 0
        try:
            # Import the (slow to import) Kubernetes client while the control plane boots.
            self.controlplane.launch()
            from llmbatch.devcluster.kubeclient import api_client
            from llmbatch.devcluster.nodeagent import NodeAgent

            await loop.run_in_executor(None, self.controlplane.wait_ready, self.cfg.start_timeout)
            self._status("starting")
            api = await api_client(self.cfg.kubeconfig)
            pki = self.state_dir / "controlplane" / "pki"
            cert = (pki / "kubelet.crt", pki / "kubelet.key")
            agent = NodeAgent(
                api,
                self.cfg.nodes,
                self.state_dir,
                marker=self.marker,
                extra_env=self.cfg.pod_env,
                kubelet_cert=cert if cert[0].is_file() else None,
            )
            agent_task = asyncio.create_task(agent.run(), name="node agent")
            registered = asyncio.create_task(agent.registered.wait())
            await asyncio.wait({agent_task, registered}, return_when=asyncio.FIRST_COMPLETED)
            if agent_task.done():
                agent_task.result()
            await self._wait_nodes_ready(api, 60)
            await self._wait_default_serviceaccount(api, 60)
            for spec in self.cfg.components:
                await self._start_component(spec)
            self._status(
                "ready",
                ready_seconds=round(time.monotonic() - began, 3),
                controlplane_ready_seconds=self.controlplane.ready_seconds,
            )
            log.info("dev cluster ready in %.1fs", time.monotonic() - began)
            stop = asyncio.create_task(self._stop.wait())
            watched: set[asyncio.Future[Any]] = {stop, agent_task}
            watched |= {asyncio.ensure_future(p.wait()) for p in self.components.values()}
            cp_exit = asyncio.ensure_future(self._wait_controlplane())
            watched.add(cp_exit)
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for fut in watched:
                if fut not in done:
                    fut.cancel()
            if stop not in done:
                code = 1
                log.error("a component stopped unexpectedly; shutting the dev cluster down")
        except Exception as err:
            log.exception("dev cluster failed")
            self._status("failed", error=str(err))
            code = 1
        finally:
            self._status("stopping")
            await self._stop_components()
            if agent_task is not None:
                agent_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await agent_task
            if api is not None:
                await api.close()
            await loop.run_in_executor(None, self.controlplane.stop)
            kill_marked(self.marker)
            reap_children()
            if code == 0:
                self._status("stopped")
            else:
                previous = read_status(self.state_dir)
                self._status("failed", error=previous.get("error", "see supervisor.log"))
        return code

    def _start_watchdog(self) -> None:
        """A separate process that kills everything carrying the marker once this one is gone
        (even by SIGKILL). It has no marker itself, and its own session."""
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llmbatch.devcluster",
                "watchdog",
                str(os.getpid()),
                self.marker,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )

    async def _wait_controlplane(self) -> None:
        while self.controlplane.process and self.controlplane.process.poll() is None:
            await asyncio.sleep(0.5)


async def _http_ok(url: str) -> bool:
    import urllib.parse

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


def supervise(state_dir: Path, *, components: Sequence[ComponentSpec] = ()) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    cfg = ClusterConfig.load(state_dir)
    cfg.components = [*cfg.components, *components]
    return asyncio.run(Supervisor(cfg).run())
