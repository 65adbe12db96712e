"""One container of a pod: its state as a kubelet reports it, its files, its termination message."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from llmbatch.devcluster.podcontext import JSON
from llmbatch.devcluster.processgroup import ProcessGroup

# The per-container file that stands in for ``terminationMessagePath`` (default
# /dev/termination-log, not writable per pod on a shared host). Every occurrence of the spec's
# path in command, args and env values is rewritten to this file; this variable holds it too.
TERMINATION_MESSAGE_ENV = "LLMBATCH_TERMINATION_MESSAGE_PATH"
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


@dataclass
class Container:
    spec: JSON
    init: bool
    directory: Path
    state: JSON = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: JSON = field(default_factory=dict)
    restart_count: int = 0
    proc: ProcessGroup | None = None
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

    @property
    def alive(self) -> bool:
        """Its process is started and not yet reaped."""
        return self.proc is not None and self.proc.returncode is None

    def signal(self, sig: int) -> None:
        """Signal the process group, unless the process was reaped (its pid may be reused)."""
        if self.proc is not None:
            self.proc.signal(sig)

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


def exit_code(returncode: int) -> int:
    """A process's returncode as a container exit code (128 + signal for a signal death)."""
    return 128 - returncode if returncode < 0 else returncode


def termination_message(c: Container, code: int, log_path: Path) -> str:
    """The termination-log file's head or, with FallbackToLogsOnError, the log's tail."""
    try:
        data = c.termination_file.read_bytes()[:MAX_TERMINATION_MESSAGE]
    except OSError:
        data = b""
    text = data.decode(errors="replace")
    if not text and code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        try:
            tail = log_path.read_bytes()[-FALLBACK_LOG_BYTES * 4 :]
        except OSError:
            tail = b""
        lines = tail.decode(errors="replace").splitlines()[-FALLBACK_LOG_LINES:]
        text = "\n".join(lines)[-FALLBACK_LOG_BYTES:]
    return text
