"""Process-group helpers: every pod process and component runs in its own process group and dies
with the process that started it."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

# Every process the dev cluster starts carries this variable (value: the cluster's state dir), so
# that leftovers can be found and killed, and tests can assert that none remain.
MARKER_ENV = "LLMBATCH_DEVCLUSTER"
# ... and this one, unique per supervisor run: a run's watchdog kills only its own run's
# processes, never those of the next `dev up` in the same state dir.
RUN_ENV = "LLMBATCH_DEVCLUSTER_RUN"


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


def _stat_fields(entry: Path) -> list[str] | None:
    """``/proc/<pid>/stat`` from the state on (field 3), or None when the process is gone."""
    try:
        stat = (entry / "stat").read_text()
    except OSError:
        return None
    # The fields follow the parenthesised command name, which may itself hold spaces.
    return stat[stat.rfind(")") + 2 :].split()


def _is_zombie(entry: Path) -> bool:
    fields = _stat_fields(entry)
    return fields is None or fields[0] in {"Z", "X"}


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` other than its leader."""
    found: list[int] = []
    for entry in _proc_entries():
        fields = _stat_fields(entry)
        if fields is None or fields[0] in {"Z", "X"} or int(fields[2]) != pgid:
            continue
        if int(entry.name) != pgid:
            found.append(int(entry.name))
    return found


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None when it is gone or a zombie.

    A pid plus its start time names one process for good: a pid alone may since have been
    handed to another process (stale pid files).
    """
    fields = _stat_fields(Path(f"/proc/{pid}"))
    if fields is None or fields[0] in {"Z", "X"}:
        return None
    return int(fields[19])  # field 22, starttime


def is_running(pid: object, started: object) -> bool:
    """Is the process recorded as (``pid``, ``started``) still running (not a zombie)?"""
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def marked_processes(
    marker: str, run: str | None = None, *, hostname: str | None = None
) -> list[int]:
    """PIDs of live (non-zombie) processes whose environment has ``MARKER_ENV=marker`` (and
    ``RUN_ENV=run``, ``HOSTNAME=hostname`` — a pod's processes — when given)."""
    me = os.getpid()
    found: list[int] = []
    for entry in _proc_entries():
        pid = int(entry.name)
        if pid == me or _is_zombie(entry):
            continue
        env = _environ(entry)
        if (
            env.get(MARKER_ENV) == marker
            and (run is None or env.get(RUN_ENV) == run)
            and (hostname is None or env.get("HOSTNAME") == hostname)
        ):
            found.append(pid)
    return sorted(found)


def kill_marked(
    marker: str, sig: int = signal.SIGKILL, run: str | None = None, *, hostname: str | None = None
) -> list[int]:
    """Kill every process carrying the marker (of one run, of one pod); returns the PIDs
    signalled."""
    pids = marked_processes(marker, run, hostname=hostname)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return pids


def kill_marked_and_wait(marker: str, timeout: float = 30.0, run: str | None = None) -> list[int]:
    """SIGKILL every marked process (of one run) until none is left: a killed process keeps its
    ports, files and pid until it has exited. The PIDs still alive after ``timeout``.

    A process signalled is waited for by its pid and start time, not by its marker: while it
    exits, the kernel drops its memory (``/proc/<pid>/environ`` reads empty, so it no longer
    looks marked) before it becomes a zombie, and under load that window is long enough for a
    caller to find it still running."""
    deadline = time.monotonic() + timeout
    signalled: dict[int, int | None] = {}
    while True:
        for pid in kill_marked(marker, run=run):
            signalled.setdefault(pid, start_time(pid))
        alive = sorted(pid for pid, started in signalled.items() if is_running(pid, started))
        marked = marked_processes(marker, run)
        if not alive and not marked:
            return []
        if time.monotonic() > deadline:
            return sorted(set(alive) | set(marked))
        time.sleep(0.05)


def kill_process_and_wait(pid: int, started: int | None, timeout: float = 10.0) -> bool:
    """SIGKILL the process (``pid``, ``started``) and wait until it is gone; False on timeout."""
    deadline = time.monotonic() + timeout
    while is_running(pid, started):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def reap_orphans(keep: Collection[int]) -> list[int]:
    """Reap this process's zombie children except ``keep`` (children whose owners reap them):
    as a child subreaper it adopts the orphans of every container whose group was killed, and
    unreaped they would hold their pids for as long as the cluster runs. The PIDs reaped."""
    me = os.getpid()
    reaped: list[int] = []
    for entry in _proc_entries():
        fields = _stat_fields(entry)
        if fields is None or fields[0] != "Z" or int(fields[1]) != me:
            continue
        pid = int(entry.name)
        if pid in keep:
            continue
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0]:
                reaped.append(pid)
    return reaped


def reap_children() -> None:
    """Collect exited children that nobody waits for (orphans adopted as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def watchdog(pid: int, marker: str, run: str | None = None, interval: float = 0.5) -> None:
    """Wait for process ``pid`` to end, then kill every process carrying ``marker`` and ``run``.

    The supervisor starts this in its own session, so that pod processes (and their children,
    which PR_SET_PDEATHSIG does not reach) die even when the supervisor is SIGKILLed. A clean
    supervisor ends its watchdog itself before exiting.
    """
    started = start_time(pid)
    while is_running(pid, started):
        time.sleep(interval)
    # Two sweeps: a process may fork between the scan and the kill.
    for _ in range(2):
        kill_marked(marker, run=run)
        time.sleep(0.2)
