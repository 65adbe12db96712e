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
from llmbatch.devcluster.procs import (
    die_with_parent,
    is_running,
    kill_marked_and_wait,
    kill_process_and_wait,
    marked_processes,
)

SUPERVISOR_LOG = "supervisor.log"


class DevClusterError(RuntimeError):
    pass


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
        # pid and start time: a stale file's pid may since belong to another process.
        data["running"] = is_running(data.get("pid"), data.get("pid_start"))
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
        # A previous run that was not stopped cleanly (supervisor SIGKILLed, its watchdog still
        # sweeping): its processes go first, so that they cannot hit this run.
        existing.clean_leftovers()
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
        """Stop the supervisor (SIGTERM, then SIGKILL) and every process it started, and return
        only once all of them are gone. True when a running cluster was stopped."""
        status = read_status(self.state_dir)
        pid: Any
        started: Any
        if self.process is not None:
            pid, started = self.process.pid, None
            was_running = self.process.poll() is None
        else:
            pid, started = status.get("pid"), status.get("pid_start")
            was_running = is_running(pid, started)
        if isinstance(pid, int) and was_running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            # SIGKILL after the timeout; a supervisor that is not our child is checked to be
            # the same process first (pid reuse).
            if not self._wait_supervisor(pid, started, timeout) and (
                self.process is not None or is_running(pid, started)
            ):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._wait_supervisor(pid, started, 10)
        self.clean_leftovers()
        return was_running

    def _wait_supervisor(self, pid: int, started: int | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                return True
            if self.process is None and not is_running(pid, started):
                return True
            time.sleep(0.1)
        return False

    def clean_leftovers(self, timeout: float = 30.0) -> None:
        """With no supervisor running: end the last run's watchdog and every process marked
        for this state dir, and wait until they are gone (they hold ports, the etcd data dir,
        log files). A watchdog left running would kill the next run's processes."""
        status = read_status(self.state_dir)
        if self.status()["running"]:
            raise DevClusterError(f"a supervisor still runs in {self.state_dir}")
        watchdog, started = status.get("watchdog_pid"), status.get("watchdog_start")
        if (
            isinstance(watchdog, int)
            and isinstance(started, int)
            and not kill_process_and_wait(watchdog, started, timeout)
        ):
            raise DevClusterError(f"watchdog {watchdog} of {self.state_dir} survived SIGKILL")
        left = kill_marked_and_wait(str(self.state_dir), timeout)
        if left:
            raise DevClusterError(f"processes of {self.state_dir} survived SIGKILL: {left}")

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
