"""Process-group helpers: every pod process and component runs in its own process group and dies
with the process that started it."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# Every process the dev cluster starts carries this variable (value: the cluster's state dir), so
# that leftovers can be found and killed, and tests can assert that none remain.
MARKER_ENV = "LLMBATCH_DEVCLUSTER"


def _prctl(option: int, arg: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except OSError:
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child between fork and exec: receive ``sig`` when the parent thread exits."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of init, so it can kill them."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def _proc_entries() -> Iterator[Path]:
    proc = Path("/proc")
    if not proc.is_dir():
        return
    for entry in proc.iterdir():
        if entry.name.isdigit():
            yield entry


def _environ(entry: Path) -> dict[str, str]:
    try:
        raw = (entry / "environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _is_zombie(entry: Path) -> bool:
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return True
    # The state follows the parenthesised command name, which may itself hold spaces.
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] in {"Z", "X"}


def marked_processes(marker: str) -> list[int]:
    """PIDs of live (non-zombie) processes whose environment has ``MARKER_ENV=marker``."""
    me = os.getpid()
    found: list[int] = []
    for entry in _proc_entries():
        pid = int(entry.name)
        if pid == me or _is_zombie(entry):
            continue
        if _environ(entry).get(MARKER_ENV) == marker:
            found.append(pid)
    return sorted(found)


def kill_marked(marker: str, sig: int = signal.SIGKILL) -> list[int]:
    """Kill every process carrying the marker; returns the PIDs signalled."""
    pids = marked_processes(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return pids


def reap_children() -> None:
    """Collect exited children that nobody waits for (orphans adopted as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def watchdog(pid: int, marker: str, interval: float = 0.5) -> None:
    """Wait for process ``pid`` to end, then kill every process carrying ``marker``.

    The supervisor starts this in its own session, so that pod processes (and their children,
    which PR_SET_PDEATHSIG does not reach) die even when the supervisor is SIGKILLed.
    """
    import time

    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        else:
            if _is_zombie(Path(f"/proc/{pid}")):
                break
        time.sleep(interval)
    # Two sweeps: a process may fork between the scan and the kill.
    for _ in range(2):
        kill_marked(marker)
        time.sleep(0.2)
