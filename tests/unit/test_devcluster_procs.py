"""Stopping a dev cluster with real processes (no control plane needed): stale status files,
a previous run's watchdog, leftovers of a run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbatch.devcluster import DevCluster
from llmbatch.devcluster.procs import MARKER_ENV, RUN_ENV, is_running, start_time


def running(pid: int) -> bool:
    return is_running(pid, None)


def wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; killed afterwards whatever happened."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def sleeper(procs: list[subprocess.Popen[bytes]], env: dict[str, str] | None = None) -> int:
    proc = subprocess.Popen(
        ["sleep", "120"], env={**os.environ, **(env or {})}, start_new_session=True
    )
    procs.append(proc)
    return proc.pid


def write_status(state_dir: Path, **fields: object) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "status.json").write_text(json.dumps(fields))


def test_a_stale_status_pid_is_not_a_running_cluster(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """status.json of a dead supervisor whose pid now belongs to another process."""
    stranger = sleeper(spawned)
    started = start_time(stranger)
    assert started is not None
    write_status(tmp_path, state="ready", pid=stranger, pid_start=started - 1)
    cluster = DevCluster(tmp_path)
    assert not cluster.running
    assert cluster.stop() is False
    assert running(stranger), "stop() signalled a process that is not the supervisor"


def test_down_waits_for_the_previous_runs_watchdog(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """`dev down` then `dev up` at once: the old run's watchdog, still polling for its dead
    supervisor, must not kill the new run's control plane. The watchdog is held stopped to force
    the interleaving the reported failure had (`control plane exited with -9`)."""
    state_dir = tmp_path / "cluster"
    marker = str(state_dir)
    supervisor = sleeper(spawned)  # stands in for the old run's supervisor
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "llmbatch.devcluster", "watchdog", str(supervisor), marker, "old"],
        start_new_session=True,
    )
    spawned.append(watchdog)
    old_pod = sleeper(spawned, {MARKER_ENV: marker, RUN_ENV: "old"})
    write_status(
        state_dir,
        state="stopped",
        pid=supervisor,
        pid_start=start_time(supervisor),
        watchdog_pid=watchdog.pid,
        watchdog_start=start_time(watchdog.pid),
    )
    os.kill(watchdog.pid, signal.SIGSTOP)  # it has not noticed yet that its supervisor is gone
    os.killpg(supervisor, signal.SIGKILL)
    spawned[0].wait()

    DevCluster(state_dir).stop()
    assert watchdog.poll() is not None, "dev down returned while the old watchdog still lives"
    assert not running(old_pod)
    assert DevCluster(state_dir).leftover_processes() == []

    new_controlplane = sleeper(spawned, {MARKER_ENV: marker, RUN_ENV: "new"})
    if watchdog.poll() is None:
        os.kill(watchdog.pid, signal.SIGCONT)
        watchdog.wait(10)
    assert running(new_controlplane), "the previous run's watchdog killed the new run"


def test_a_watchdog_kills_only_its_own_run(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    marker = str(tmp_path)
    supervisor = sleeper(spawned)
    mine = sleeper(spawned, {MARKER_ENV: marker, RUN_ENV: "mine"})
    other = sleeper(spawned, {MARKER_ENV: marker, RUN_ENV: "next"})
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "llmbatch.devcluster", "watchdog", str(supervisor), marker, "mine"],
        start_new_session=True,
    )
    spawned.append(watchdog)
    os.killpg(supervisor, signal.SIGKILL)
    spawned[0].wait()
    watchdog.wait(20)
    assert wait_gone(mine)
    assert running(other)


def test_start_cleans_a_sigkilled_runs_leftovers(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Leftovers of a run whose supervisor and watchdog were both SIGKILLed are gone before
    a new supervisor starts (they hold its ports and etcd directory)."""
    marker = str(tmp_path)
    leftover = sleeper(spawned, {MARKER_ENV: marker, RUN_ENV: "old"})
    write_status(tmp_path, state="ready", pid=999_999, pid_start=1)
    DevCluster(tmp_path).clean_leftovers()
    assert not running(leftover)


def test_a_killed_process_that_no_longer_looks_marked_is_waited_for_until_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The interleaving behind a once-flaky test_start_cleans_a_sigkilled_runs_leftovers: a
    SIGKILLed process drops its memory (its environ reads empty: unmarked) before it becomes a
    zombie. Forced here: the process looks marked once, then unmarked for three polls while it
    still runs. The wait must last until it is gone, not until nothing looks marked."""
    from llmbatch.devcluster import procs

    polls = {"marked": 0, "running": 0}

    def marked(marker: str, run: str | None = None, **_: object) -> list[int]:
        polls["marked"] += 1
        return [4242] if polls["marked"] == 1 else []

    def alive(pid: object, started: object) -> bool:
        polls["running"] += 1
        return polls["running"] <= 3

    monkeypatch.setattr(procs, "marked_processes", marked)
    monkeypatch.setattr(procs, "is_running", alive)
    monkeypatch.setattr(procs, "start_time", lambda pid: 7)
    monkeypatch.setattr(procs.os, "kill", lambda pid, sig: None)
    assert procs.kill_marked_and_wait("m", timeout=5) == []
    assert polls["running"] == 4  # waited through the three polls it still ran
