"""Run one pod as local processes and report its status the way a kubelet does.

Images are ignored: a container runs its ``command`` + ``args`` on this machine, in its own process
group, with the pod's ``env``/``envFrom`` and ``workingDir``. See docs/devcluster.md.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import json
import logging
import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from llmbatch.devcluster.expansion import expand
from llmbatch.devcluster.procs import MARKER_ENV, die_with_parent, signal_group

log = logging.getLogger(__name__)

JSON = dict[str, Any]

# The per-container file that stands in for ``terminationMessagePath`` (default
# /dev/termination-log, not writable per pod on a shared host). Every occurrence of the spec's
# path in command, args and env values is rewritten to this file; this variable holds it too.
TERMINATION_MESSAGE_ENV = "LLMBATCH_TERMINATION_MESSAGE_PATH"
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``4Gi``, ``2``) as a Decimal."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"invalid quantity {text!r}")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2)]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_command(argv: list[str], path: str | None) -> list[str]:
    """``python``/``python3`` run the current interpreter (the project venv); other names go
    through PATH."""
    if not argv:
        return argv
    head = argv[0]
    if _PYTHON.fullmatch(head):
        return [sys.executable, *argv[1:]]
    if os.sep not in head:
        found = shutil.which(head, path=path)
        if found:
            return [found, *argv[1:]]
    return argv


class ContainerConfigError(Exception):
    """The container cannot start yet (missing secret or config map, no command)."""


# Looks up a key in a Secret or ConfigMap: (kind, namespace, name) -> data, None when absent.
ObjectReader = Callable[[str, str, str], Awaitable[dict[str, str] | None]]
StatusWriter = Callable[[JSON], Awaitable[bool]]
# (pod, service account, expirationSeconds, audience or None) -> token
TokenRequester = Callable[[JSON, str, int, str | None], Awaitable[str]]
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass
class PodContext:
    """What a pod runner needs from the node agent."""

    pods_dir: Path
    node_allocatable: Mapping[str, str]
    base_env: Mapping[str, str]
    marker: str
    read_object: ObjectReader
    write_status: Callable[[str, str, JSON], Awaitable[bool]]
    delete_pod: Callable[[str, str, str], Awaitable[None]]
    record_event: Callable[[JSON, str, str, str], Awaitable[None]]
    request_token: TokenRequester | None = None
    """Mints a service-account token for a pod (None: no projected token volumes)."""
    server: str = ""
    """API server URL written into a pod's service-account kubeconfig."""
    ca_data: bytes = b""
    """API server CA (PEM) written next to the token."""
    restart_backoff_max: float = 10.0


@dataclass
class _Container:
    spec: JSON
    init: bool
    directory: Path
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    restart_count: int = 0
    proc: asyncio.subprocess.Process | None = None
    ever_started: bool = False
    done: bool = False  # exited and will not restart
    probe_ready: bool = True  # the readiness probe's last verdict (True without a probe)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def termination_file(self) -> Path:
        return self.directory / "termination-log"

    def log_file(self, restart: int | None = None) -> Path:
        return self.directory / f"{self.restart_count if restart is None else restart}.log"

    @property
    def running(self) -> bool:
        return "running" in self.state

    def status(self, ready: bool) -> JSON:
        def full(state: JSON) -> JSON:
            # Strategic merge patch merges maps: null out the state kinds that no longer apply.
            return {kind: state.get(kind) for kind in ("waiting", "running", "terminated")}

        return {
            "name": self.name,
            "image": self.spec.get("image") or "none",
            "imageID": "",
            "containerID": f"process://{self.proc.pid}" if self.proc else None,
            "state": full(self.state),
            "lastState": full(self.last_state) if self.last_state else {},
            "ready": ready and self.running and self.probe_ready,
            "started": self.running,
            "restartCount": self.restart_count,
        }


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


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
        self.directory = ctx.pods_dir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        self.init_containers = [
            _Container(c, True, self.directory / c["name"])
            for c in spec.get("initContainers") or []
        ]
        self.containers = [
            _Container(c, False, self.directory / c["name"]) for c in spec.get("containers") or []
        ]
        self.start_time = now_rfc3339()
        self.started_monotonic = time.monotonic()
        self.initialized = not self.init_containers
        self.failed_init = False
        self.stopping = False
        self.deleted = False
        self.reason: str | None = None
        self.message: str | None = None
        self._transitions: dict[str, tuple[str, str]] = {}
        self._dirty = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._stop_grace = 30.0
        self._published_final = False
        self._gone = False  # the pod object no longer exists
        self.task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")

    def update(self, pod: JSON) -> None:
        """A newer version of the pod object arrived from the watch."""
        self.pod = pod
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self.stopping:
            grace = meta.get("deletionGracePeriodSeconds")
            self.request_stop(float(grace) if grace is not None else 30.0, deleted=True)

    def request_stop(self, grace: float, *, deleted: bool = False) -> None:
        self.deleted = self.deleted or deleted
        if self._stop_requested.is_set():
            self._stop_grace = min(self._stop_grace, grace)
            return
        self._stop_grace = grace
        self._stop_requested.set()

    def forget(self) -> None:
        """The pod object is gone from the API: kill now, write nothing more."""
        self._gone = True
        self.request_stop(0.0, deleted=True)

    @property
    def finished(self) -> bool:
        return self.task is not None and self.task.done()

    async def _run(self) -> None:
        publisher = asyncio.create_task(self._publisher())
        deadline = asyncio.create_task(self._deadline())
        try:
            await self._lifecycle()
        except Exception:
            log.exception("pod %s/%s: runner failed", self.namespace, self.name)
            self.reason = self.reason or "NodeAgentError"
            self._kill_all(signal.SIGKILL)
        finally:
            deadline.cancel()
            self._kill_all(signal.SIGKILL)
            self._mark_dirty()
            await asyncio.sleep(0)
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
            if not self._gone:
                await self._publish()
                if self.deleted:
                    await self.ctx.delete_pod(self.namespace, self.name, self.uid)

    async def _lifecycle(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._mark_dirty()
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
                    if not self.stopping and not self._stop_requested.is_set():
                        self.failed_init = True
                    return
            self.initialized = True
            self._mark_dirty()
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
        self.stopping = True
        grace = self._stop_grace
        running = [
            c
            for c in [*self.init_containers, *self.containers]
            if c.proc and c.proc.returncode is None
        ]
        if running:
            await self.ctx.record_event(
                self.pod, "Normal", "Killing", f"Stopping containers (grace {grace:g}s)"
            )
        self._kill_all(signal.SIGTERM)
        self._mark_dirty()
        if tasks:
            _, still = await asyncio.wait(tasks, timeout=max(grace, 0.0))
            if still:
                self._kill_all(signal.SIGKILL)
                await asyncio.wait(still, timeout=10)

    def _kill_all(self, sig: int) -> None:
        for c in [*self.init_containers, *self.containers]:
            # A reaped container's group was killed when it exited (_run_once); its pid may
            # since belong to another process, so it is never signalled again.
            if c.proc is not None and c.proc.returncode is None:
                signal_group(c.proc.pid, sig)

    async def _deadline(self) -> None:
        seconds = self.pod["spec"].get("activeDeadlineSeconds")
        if seconds is None:
            return
        await asyncio.sleep(max(0.0, float(seconds) - (time.monotonic() - self.started_monotonic)))
        if self.stopping or self._stop_requested.is_set():
            return
        self.reason = "DeadlineExceeded"
        self.message = "Pod was active on the node longer than the specified deadline"
        await self.ctx.record_event(self.pod, "Normal", "DeadlineExceeded", self.message)
        grace = self.pod["spec"].get("terminationGracePeriodSeconds")
        self.request_stop(float(grace) if grace is not None else 30.0)

    # -- one container ---------------------------------------------------------------------

    def _should_restart(self, code: int) -> bool:
        if self.stopping or self._stop_requested.is_set():
            return False
        if self.restart_policy == "Always":
            return True
        if self.restart_policy == "OnFailure":
            return code != 0
        return False

    async def _supervise(self, c: _Container) -> bool:
        """Run a container, restarting it as the policy says; True when it ended with exit 0."""
        backoff = 1.0
        while True:
            if self.stopping or self._stop_requested.is_set():
                c.state = {"terminated": c.state.get("terminated") or self._never_ran()}
                c.done = True
                self._mark_dirty()
                return False
            try:
                code = await self._run_once(c)
            except ContainerConfigError as err:
                c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(err)}}
                self._mark_dirty()
                await self._sleep_or_stop(2.0)
                continue
            if not self._should_restart(code) and not (c.init and code != 0 and self._retry_init()):
                c.done = True
                self._mark_dirty()
                return code == 0
            if c.init and code == 0:
                c.done = True
                self._mark_dirty()
                return True
            # Restart after a back-off (kubelet: 10s doubling to 5min; here 1s doubling to 10s).
            c.last_state = c.state
            c.restart_count += 1
            c.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {backoff:g}s restarting failed container={c.name}",
                }
            }
            self._mark_dirty()
            await self._sleep_or_stop(backoff)
            backoff = min(backoff * 2, self.ctx.restart_backoff_max)

    def _retry_init(self) -> bool:
        return self.restart_policy != "Never" and not self.stopping

    def _never_ran(self) -> JSON:
        return {"exitCode": 137, "reason": "ContainerStatusUnknown", "message": "never started"}

    async def _sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_requested.wait(), timeout=seconds)

    async def _run_once(self, c: _Container) -> int:
        c.directory.mkdir(parents=True, exist_ok=True)
        argv, env, cwd = await self._prepare(c)
        term_file = c.termination_file
        term_file.unlink(missing_ok=True)
        term_file.touch()
        log_path = c.log_file()
        started = now_rfc3339()
        with log_path.open("ab") as out:
            try:
                c.proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )
            except OSError as err:
                out.write(f"failed to start {argv!r}: {err}\n".encode())
                c.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": f"failed to start container process: {err}",
                        "startedAt": started,
                        "finishedAt": now_rfc3339(),
                    }
                }
                self._mark_dirty()
                return 128
        c.ever_started = True
        # Not ready until the probe says so, also after a restart (a kubelet resets it too).
        c.probe_ready = "readinessProbe" not in c.spec
        c.state = {"running": {"startedAt": started}}
        await self.ctx.record_event(
            self.pod, "Normal", "Started", f"Started container {c.name} (pid {c.proc.pid})"
        )
        self._mark_dirty()
        probe = c.spec.get("readinessProbe")
        prober = asyncio.create_task(self._readiness(c, probe)) if probe else None
        try:
            returncode = await c.proc.wait()
        finally:
            if prober is not None:
                prober.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prober
        # Like a container's PID namespace: when the main process ends, the rest of its group goes.
        signal_group(c.proc.pid, signal.SIGKILL)
        code = _exit_code(returncode)
        terminated: JSON = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now_rfc3339(),
            "containerID": f"process://{c.proc.pid}",
        }
        if returncode < 0:
            terminated["signal"] = -returncode
        message = self._termination_message(c, code, log_path)
        if message:
            terminated["message"] = message
        c.state = {"terminated": terminated}
        self._mark_dirty()
        return code

    async def _readiness(self, c: _Container, probe: JSON) -> None:
        """Run an httpGet or tcpSocket readiness probe against 127.0.0.1, like a kubelet."""
        period = float(probe.get("periodSeconds") or 10)
        timeout = float(probe.get("timeoutSeconds") or 1)
        need = {
            True: int(probe.get("successThreshold") or 1),
            False: int(probe.get("failureThreshold") or 3),
        }
        streak: tuple[bool, int] = (False, 0)
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        while True:
            ok = await self._probe_once(c, probe, timeout)
            streak = (ok, streak[1] + 1 if streak[0] == ok else 1)
            if streak[1] >= need[ok] and c.probe_ready != ok:
                c.probe_ready = ok
                self._mark_dirty()
            # A kubelet probes a not-yet-ready container at the same period; poll faster so
            # tests and `helm install --wait` do not idle (the verdict rules are unchanged).
            await asyncio.sleep(period if c.probe_ready else min(period, 1.0))

    def _probe_port(self, c: _Container, port: int | str) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for declared in c.spec.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
        raise ContainerConfigError(f"probe port {port!r} is not a named port of {c.name}")

    async def _probe_once(self, c: _Container, probe: JSON, timeout: float) -> bool:
        try:
            if "httpGet" in probe:
                action = probe["httpGet"]
                port = self._probe_port(c, action["port"])
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), timeout
                )
                try:
                    path = action.get("path") or "/"
                    writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
                    await writer.drain()
                    line = await asyncio.wait_for(reader.readline(), timeout)
                finally:
                    writer.close()
                parts = line.split()
                return len(parts) >= 2 and 200 <= int(parts[1]) < 400
            if "tcpSocket" in probe:
                port = self._probe_port(c, probe["tcpSocket"]["port"])
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection("127.0.0.1", port), timeout
                )
                writer.close()
                return True
        except (OSError, TimeoutError, ValueError, ContainerConfigError):
            return False
        return True  # exec/grpc probes are not run here: treated as passing

    def _termination_message(self, c: _Container, code: int, log_path: Path) -> str:
        try:
            data = c.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
        except OSError:
            data = b""
        text = data.decode(errors="replace")
        if (
            not text
            and code != 0
            and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        ):
            try:
                tail = log_path.read_bytes()[-FALLBACK_LOG_BYTES * 4 :]
            except OSError:
                tail = b""
            lines = tail.decode(errors="replace").splitlines()[-FALLBACK_LOG_LINES:]
            text = "\n".join(lines)[-FALLBACK_LOG_BYTES:]
        return text

    # -- environment -----------------------------------------------------------------------

    async def _prepare(self, c: _Container) -> tuple[list[str], dict[str, str], str]:
        spec = c.spec
        term_path = spec.get("terminationMessagePath") or "/dev/termination-log"
        term_file = str(c.termination_file)
        env: dict[str, str] = dict(self.ctx.base_env)
        env["HOSTNAME"] = self.name
        env[MARKER_ENV] = self.ctx.marker
        env[TERMINATION_MESSAGE_ENV] = term_file
        declared: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            declared.update(await self._env_from(source))
        for var in spec.get("env") or []:
            name = var["name"]
            if "valueFrom" in var:
                value = await self._value_from(var["valueFrom"], c)
                if value is None:
                    continue
            else:
                value = expand(var.get("value") or "", {**env, **declared})
            declared[name] = value.replace(term_path, term_file)
        env.update(await self._service_account_env(spec, declared))
        env.update(declared)
        command = [expand(a, env) for a in spec.get("command") or []]
        args = [expand(a, env) for a in spec.get("args") or []]
        if not command:
            raise ContainerConfigError(
                f"container {c.name} has no command: images are not run, so the image's "
                "entrypoint is unknown; set command"
            )
        argv = [a.replace(term_path, term_file) for a in [*command, *args]]
        argv = resolve_command(argv, env.get("PATH"))
        cwd = spec.get("workingDir") or str(c.directory)
        try:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ContainerConfigError(f"workingDir {cwd}: {err}") from err
        return argv, env, cwd

    async def _service_account_env(self, spec: JSON, declared: Mapping[str, str]) -> dict[str, str]:
        """The projected service-account token, the way this agent can mount it.

        A kubelet mounts the ``kube-api-access-*`` projected volume (token, ca.crt, namespace) at
        /var/run/secrets/kubernetes.io/serviceaccount. Processes on a shared host cannot each own
        that path, so the agent writes the volume under the pod's directory and points
        ``KUBECONFIG`` at a kubeconfig holding the same token: Kubernetes clients fall back to it
        when there is no in-cluster token file. The token is a real TokenRequest for the pod's
        service account, bound to the pod, so the API server applies that account's RBAC.
        """
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        for mount in spec.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            sources = ((volume or {}).get("projected") or {}).get("sources") or []
            token_source = next(
                (s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s), None
            )
            if token_source is None or "KUBECONFIG" in declared:
                continue
            kubeconfig = await self._project_token(mount["name"], sources, token_source)
            return {"KUBECONFIG": str(kubeconfig)}
        return {}

    async def _project_token(self, volume: str, sources: list[JSON], token_source: JSON) -> Path:
        directory = self.directory / "volumes" / volume
        kubeconfig = directory / "kubeconfig"
        if kubeconfig.exists():
            return kubeconfig
        if self.ctx.request_token is None:
            raise ContainerConfigError(f"volume {volume}: this node cannot mint tokens")
        account = self.pod["spec"].get("serviceAccountName") or "default"
        try:
            token = await self.ctx.request_token(
                self.pod,
                account,
                int(token_source.get("expirationSeconds") or 3607),
                token_source.get("audience"),
            )
        except Exception as err:
            raise ContainerConfigError(f"volume {volume}: token for {account}: {err}") from err
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        token_file = directory / str(token_source.get("path") or "token")
        token_file.write_text(token)
        token_file.chmod(0o600)
        for source in sources:
            for item in (source.get("configMap") or {}).get("items") or []:
                if item.get("key") == "ca.crt":
                    (directory / item["path"]).write_bytes(self.ctx.ca_data)
            for item in (source.get("downwardAPI") or {}).get("items") or []:
                field_path = (item.get("fieldRef") or {}).get("fieldPath")
                if field_path:
                    (directory / item["path"]).write_text(self._field(field_path))
        ca_file = directory / "devcluster-ca.crt"
        ca_file.write_bytes(self.ctx.ca_data)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {"server": self.ctx.server, "certificate-authority": str(ca_file)},
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {
                        "cluster": "in-cluster",
                        "user": account,
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "in-cluster",
        }
        tmp = kubeconfig.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        tmp.chmod(0o600)
        tmp.replace(kubeconfig)
        return kubeconfig

    async def _env_from(self, source: JSON) -> dict[str, str]:
        prefix = source.get("prefix") or ""
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data = await self.ctx.read_object(kind, self.namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    return {}
                raise ContainerConfigError(f'{kind.lower()} "{ref["name"]}" not found')
            return {prefix + k: v for k, v in data.items()}
        return {}

    async def _value_from(self, source: JSON, c: _Container) -> str | None:
        for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data = await self.ctx.read_object(kind, self.namespace, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                what = f'{kind.lower()} "{ref["name"]}"'
                raise ContainerConfigError(
                    f"{what} not found" if data is None else f'key "{ref["key"]}" not in {what}'
                )
            return data[ref["key"]]
        if "fieldRef" in source:
            return self._field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource_field(source["resourceFieldRef"], c)
        raise ContainerConfigError(f"unsupported valueFrom {sorted(source)}")

    def _field(self, path: str) -> str:
        meta = self.pod["metadata"]
        spec = self.pod["spec"]
        match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']*)'\]", path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            items = meta.get(path.split(".")[1]) or {}
            return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(items.items()))
        simple = {
            "metadata.name": meta.get("name"),
            "metadata.namespace": meta.get("namespace"),
            "metadata.uid": meta.get("uid"),
            "spec.nodeName": spec.get("nodeName"),
            "spec.serviceAccountName": spec.get("serviceAccountName"),
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
        }
        if path not in simple:
            raise ContainerConfigError(f"unsupported fieldRef {path}")
        return str(simple[path] or "")

    def _resource_field(self, ref: JSON, c: _Container) -> str:
        target = c.spec
        if ref.get("containerName"):
            for other in [*self.containers, *self.init_containers]:
                if other.name == ref["containerName"]:
                    target = other.spec
        kind, _, resource = str(ref["resource"]).partition(".")
        resources = target.get("resources") or {}
        value = (resources.get(kind) or {}).get(resource)
        if value is None and kind == "requests":
            value = (resources.get("limits") or {}).get(resource)
        if value is None:
            value = self.ctx.node_allocatable.get(resource, "0")
        divisor = parse_quantity(ref.get("divisor") or "1")
        return str(math.ceil(parse_quantity(value) / divisor))

    # -- status ----------------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        self._dirty.set()

    async def _publisher(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await self._publish()
            await asyncio.sleep(0.05)  # coalesce bursts of changes

    def _phase(self) -> str:
        if self.reason == "DeadlineExceeded" and all(
            not c.running for c in [*self.init_containers, *self.containers]
        ):
            return "Failed"
        if self.failed_init:
            return "Failed"
        if not self.initialized:
            return "Pending"
        if self.containers and all(c.done for c in self.containers):
            codes = [int(c.state.get("terminated", {}).get("exitCode", 1)) for c in self.containers]
            return "Succeeded" if all(code == 0 for code in codes) else "Failed"
        if any(c.running or c.ever_started for c in self.containers):
            return "Running"
        return "Pending"

    def _condition(self, kind: str, ok: bool, reason: str | None = None) -> JSON:
        status = "True" if ok else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, now_rfc3339())
        cond: JSON = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": self._transitions[kind][1],
        }
        if reason and not ok:
            cond["reason"] = reason
        return cond

    def status(self) -> JSON:
        phase = self._phase()
        terminal = phase in ("Succeeded", "Failed")
        ready = (
            not terminal
            and not self.stopping
            and self.initialized
            and bool(self.containers)
            and all(c.running and c.probe_ready for c in self.containers)
        )
        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        status: JSON = {
            "phase": phase,
            "conditions": [
                self._condition("PodReadyToStartContainers", True),
                self._condition("Initialized", self.initialized, "ContainersNotInitialized"),
                self._condition("ContainersReady", ready, not_ready_reason),
                self._condition("Ready", ready, not_ready_reason),
                self._condition("PodScheduled", True),
            ],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": self.start_time,
            "containerStatuses": [c.status(ready) for c in self.containers],
            "reason": self.reason,
            "message": self.message,
        }
        if self.init_containers:
            status["initContainerStatuses"] = [c.status(c.running) for c in self.init_containers]
        return status

    async def _publish(self) -> None:
        if self._gone:
            return
        body = {"status": self.status()}
        if not await self.ctx.write_status(self.namespace, self.name, body):
            self._gone = True


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (data or {}).items():
        out[key] = base64.b64decode(value).decode(errors="replace")
    return out
