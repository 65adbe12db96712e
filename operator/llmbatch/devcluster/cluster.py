"""Start and stop a whole dev cluster (a supervisor process) from synchronous code: ``llmbatch dev``
and the pytest fixtures use this."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from llmbatch.devcluster.config import ClusterConfig, read_status
from llmbatch.devcluster.controlplane import kubectl_binary, tail
from llmbatch.devcluster.procs import die_with_parent, kill_marked, marked_processes

SUPERVISOR_LOG = "supervisor.log"


class DevClusterError(RuntimeError):
    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] not in {"Z", "X"}


@dataclass
class DevCluster:
    """A running (or stopped) dev cluster rooted at ``state_dir``."""

    state_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def pods_dir(self) -> Path:
        return self.state_dir / "pods"

    def status(self) -> dict[str, Any]:
        """``status.json`` of the supervisor plus ``running`` (is the supervisor alive)."""
        data = read_status(self.state_dir)
        pid = data.get("pid")
        data["running"] = bool(isinstance(pid, int) and _alive(pid))
        return data

    @property
    def running(self) -> bool:
        return bool(self.status()["running"])

    @classmethod
    def start(
        cls, cfg: ClusterConfig, *, detach: bool = False, timeout: float = 180.0
    ) -> DevCluster:
        """Start a supervisor for ``cfg`` and wait until the cluster is ready.

        ``detach=True`` (``llmbatch dev up``): the supervisor outlives this process. Otherwise it
        dies with this process (the test fixtures).
        """
        state_dir = cfg.state_dir.resolve()
        cfg.state_dir = state_dir
        existing = cls(state_dir)
        if existing.running:
            raise DevClusterError(
                f"a dev cluster is already running in {state_dir} (pid {existing.status()['pid']})"
            )
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / "status.json").unlink(missing_ok=True)
        cfg.save()
        log_path = state_dir / SUPERVISOR_LOG
        argv = [sys.executable, "-m", "llmbatch.devcluster", "supervise", str(state_dir)]
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if detach else partial(die_with_parent, signal.SIGTERM),
            )
        cluster = cls(state_dir, process)
        deadline = time.monotonic() + timeout
        while True:
            status = read_status(state_dir)
            state = status.get("state")
            if state == "ready" and status.get("pid") == process.pid:
                return cluster
            if state == "failed" or process.poll() is not None:
                cluster.stop()
                raise DevClusterError(
                    f"dev cluster failed to start: {status.get('error', '')}\n"
                    f"--- {log_path}\n{tail(log_path)}\n"
                    f"--- control plane log\n{tail(state_dir / 'logs' / 'controlplane.log', 20)}"
                )
            if time.monotonic() > deadline:
                cluster.stop()
                raise DevClusterError(
                    f"dev cluster not ready within {timeout:g}s\n{tail(log_path)}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> bool:
        """Stop the supervisor (SIGTERM, then SIGKILL) and every process it started. True when a
        running cluster was stopped."""
        status = read_status(self.state_dir)
        pid = self.process.pid if self.process else status.get("pid")
        was_running = isinstance(pid, int) and _alive(pid)
        if isinstance(pid, int) and was_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    break
                if self.process is None and not _alive(pid):
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        kill_marked(str(self.state_dir))
        return was_running

    def leftover_processes(self) -> list[int]:
        """PIDs of processes started for this cluster that are still alive."""
        return marked_processes(str(self.state_dir))

    def kubectl(self, *args: str, check: bool = True, timeout: float = 60.0) -> str:
        """Run ``.cache/bin/kubectl --kubeconfig <state>/kubeconfig ARGS``; stdout."""
        result = subprocess.run(
            [str(kubectl_binary()), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise DevClusterError(
                f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout
