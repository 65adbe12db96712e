"""A child process leading its own process group, which is never signalled once reaped.

asyncio's child watcher reaps a process as soon as it exits; afterwards its pid — which is also
the process-group id — may be handed to any new process (pid_max is 32768 on small machines), so
a later ``killpg`` could hit a stranger. :class:`ProcessGroup` watches the exit through a pidfd
instead: the exited leader stays a zombie, which keeps its pid reserved, while the rest of the
group is killed (like a container's PID namespace), and only then is it reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from llmbatch.devcluster.procs import group_members

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.1  # exit polling where pidfd_open is missing (Linux < 5.3)
GROUP_KILL_SECONDS = 10.0  # how long a killed group may take to exit before the leader is reaped
_UNREAPED: set[int] = set()  # leaders spawned here and not yet reaped (their owner reaps them)


def unreaped_pids() -> frozenset[int]:
    """Children started as a ProcessGroup that are not reaped yet: an orphan reaper skips them."""
    return frozenset(_UNREAPED)


class ProcessGroup:
    """A started child in its own session; ``pid`` is also its process-group id."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid = popen.pid
        _UNREAPED.add(self.pid)
        self.returncode: int | None = None
        """Set at the moment the leader is reaped (negative: killed by that signal)."""

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | None,
        output: IO[bytes] | int,
        preexec_fn: Callable[[], None] | None = None,
    ) -> ProcessGroup:
        """Start ``argv`` in a new session with stdout and stderr to ``output``; raises OSError."""
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec_fn,
        )
        return cls(popen)

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the group while its leader is unreaped; False otherwise."""
        if self.returncode is not None:
            return False
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def wait(self) -> int:
        """Wait for the leader to exit, kill what is left of its group and wait until it is gone
        (like a container's PID namespace), reap the leader; the returncode.

        Safe to call from several tasks and again after cancellation.
        """
        while self.returncode is None:
            await self._exited()
            if self.returncode is None:
                await self._empty_group()
            if self.returncode is None:
                self._reap()
        return self.returncode

    async def _empty_group(self) -> None:
        """SIGKILL the rest of the group until no live member is left (bounded)."""
        # The leader is a zombie here: its pid, the group id, cannot be reused until it is
        # reaped, so signalling the group cannot hit another process.
        deadline = time.monotonic() + GROUP_KILL_SECONDS
        while self.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            members = group_members(self.pid)
            if not members:
                return
            if time.monotonic() > deadline:
                log.warning("process group %d: %s survive SIGKILL", self.pid, members)
                return
            await asyncio.sleep(_POLL_SECONDS / 5)

    def _reap(self) -> None:
        try:
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            log.warning("process %d was reaped by someone else", self.pid)
            code = -signal.SIGKILL
        self.returncode = code
        self._popen.returncode = code  # so that subprocess never waits for it again
        _UNREAPED.discard(self.pid)

    def has_exited(self) -> bool:
        """Has the leader exited (reaped or not)? Does not block."""
        if self.returncode is not None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    async def _exited(self) -> None:
        """Return once the leader has exited (it is left unreaped)."""
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            while not self.has_exited():
                await asyncio.sleep(_POLL_SECONDS)
            return
        loop = asyncio.get_running_loop()
        readable: asyncio.Future[None] = loop.create_future()

        def on_readable() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(fd, on_readable)
        try:
            await readable
        finally:
            loop.remove_reader(fd)
            os.close(fd)
