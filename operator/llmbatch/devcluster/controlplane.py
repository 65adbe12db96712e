"""The control-plane process (``hack/testcluster``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler in one binary), started as a child process."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from llmbatch.devcluster.procs import MARKER_ENV, die_with_parent

TESTCLUSTER_ENV = "LLMBATCH_TESTCLUSTER"
KUBECTL_ENV = "LLMBATCH_KUBECTL"
_READY = re.compile(r"testcluster: ready server=(\S+)")


class ControlPlaneError(RuntimeError):
    pass


def repo_root() -> Path:
    """The checkout holding this package (the directory with the top Makefile), else the cwd."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "hack" / "testcluster" / "go.mod").is_file():
            return parent
    return Path.cwd()


def testcluster_binary() -> Path:
    """``$LLMBATCH_TESTCLUSTER`` or ``<repo>/.cache/bin/testcluster`` (``make testcluster``)."""
    override = os.environ.get(TESTCLUSTER_ENV)
    return Path(override) if override else repo_root() / ".cache" / "bin" / "testcluster"


def kubectl_binary() -> Path:
    """``$LLMBATCH_KUBECTL`` or ``<repo>/.cache/bin/kubectl`` (built by ``make kubectl``)."""
    override = os.environ.get(KUBECTL_ENV)
    return Path(override) if override else repo_root() / ".cache" / "bin" / "kubectl"


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ControlPlane:
    """One control-plane child process. State (certificates, etcd, log) lives in ``state_dir``;
    the admin kubeconfig is ``state_dir/kubeconfig``."""

    def __init__(
        self,
        state_dir: Path,
        *,
        binary: Path | None = None,
        port: int = 0,
        extra_args: Sequence[str] = (),
        marker: str | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.binary = binary or testcluster_binary()
        self.port = port
        self.extra_args = list(extra_args)
        self.marker = marker or str(state_dir)
        self.kubeconfig = state_dir / "kubeconfig"
        self.log_path = state_dir / "logs" / "controlplane.log"
        self.server: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.ready_seconds: float | None = None
        self.launched_at = 0.0
        """``time.monotonic()`` of the last launch."""
        self._log_offset = 0

    def start(self, timeout: float = 120.0) -> None:
        """Launch and wait until the control plane serves (``/readyz`` ok, controllers started)."""
        self.launch()
        self.wait_ready(timeout)

    def launch(self, *, keep_state: bool = False) -> None:
        """Start the process. ``keep_state``: continue the cluster of the previous launch (its
        etcd data, certificates, port and kubeconfig: clients reconnect as to a restarted API
        server) instead of starting a fresh one."""
        if not self.binary.is_file():
            raise ControlPlaneError(
                f"{self.binary} not found: build it with `make testcluster` "
                "(see docs/devcluster.md)"
            )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if not keep_state:
            self.kubeconfig.unlink(missing_ok=True)
        argv = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--data-dir={self.state_dir / 'controlplane'}",
            f"--port={self.port}",
            "--exit-with-parent",
            *(["--keep-state"] if keep_state else []),
            *self.extra_args,
        ]
        env = dict(os.environ)
        env[MARKER_ENV] = self.marker
        self.launched_at = time.monotonic()
        # A continued cluster appends to the log; readiness is looked for in this launch's part.
        self._log_offset = (
            self.log_path.stat().st_size if keep_state and self.log_path.exists() else 0
        )
        with self.log_path.open("ab" if keep_state else "wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=partial(die_with_parent, signal.SIGTERM),
            )

    def wait_ready(self, timeout: float = 120.0) -> None:
        if self.process is None:
            raise ControlPlaneError("not launched")
        began = self.launched_at
        deadline = began + timeout
        while time.monotonic() < deadline:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                match = _READY.search(log.read().decode(errors="replace"))
            if match:
                self.server = match.group(1)
                self.ready_seconds = time.monotonic() - began
                return
            if self.process.poll() is not None:
                raise ControlPlaneError(
                    f"control plane exited with {self.process.returncode}:\n{tail(self.log_path)}"
                )
            time.sleep(0.1)
        self.stop()
        raise ControlPlaneError(
            f"control plane not ready within {timeout:g}s:\n{tail(self.log_path)}"
        )

    def stop(self, timeout: float = 20.0) -> None:
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        """The exit status once the process has ended (negative: killed by that signal)."""
        return self.process.poll() if self.process else None
