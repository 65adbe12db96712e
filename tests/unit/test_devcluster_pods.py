"""The node agent's pod runner with real processes (no API server: the context records what the
runner would send)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from llmbatch.devcluster.containers import TERMINATION_MESSAGE_ENV, Container
from llmbatch.devcluster.podcontext import ContainerConfigError
from llmbatch.devcluster.podenv import PodEnvironment
from llmbatch.devcluster.pods import PodContext, PodRunner
from tests.fixtures.ports import free_port

JSON = dict[str, Any]


class Recorder:
    """Stands in for the node agent's API calls (a unit test of the runner, not of the API)."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, str]] | None = None) -> None:
        self.objects = objects or {}
        self.statuses: list[JSON] = []
        self.events: list[tuple[str, str]] = []
        self.deleted: list[str] = []

    async def read_object(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return self.objects.get((kind, name))

    async def write_status(self, namespace: str, name: str, body: JSON) -> bool:
        self.statuses.append(body["status"])
        return True

    async def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append(name)

    async def record_event(self, pod: JSON, kind: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def context(self, pods_dir: Path) -> PodContext:
        return PodContext(
            pods_dir=pods_dir,
            node_allocatable={"cpu": "32", "memory": "256Gi"},
            base_env={"PATH": os.environ["PATH"]},
            marker=f"unit-test-{os.getpid()}",
            read_object=self.read_object,
            write_status=self.write_status,
            delete_pod=self.delete_pod,
            record_event=self.record_event,
        )


def pod(containers: list[JSON], **spec: Any) -> JSON:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "0123456789abcdef"},
        "spec": {"restartPolicy": "Never", "containers": containers, **spec},
    }


def unreaped_child(pid: int) -> bool:
    """Is ``pid`` still a child of this process that nobody has reaped (running or zombie)?"""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Every killpg the runner sends: (pgid, signal, was the group leader still unreaped)."""
    sent: list[tuple[int, int, bool]] = []
    real = os.killpg

    def spy(pgid: int, sig: int) -> None:
        sent.append((pgid, sig, unreaped_child(pgid)))
        real(pgid, sig)

    monkeypatch.setattr(os, "killpg", spy)
    return sent


async def wait_until(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_a_reaped_container_is_never_signalled(
    tmp_path: Path, signals: list[tuple[int, int, bool]]
) -> None:
    """The pid of a reaped container may already belong to another process (pid_max is 32768):
    its group is killed while the exited leader is still a zombie, and never signalled after."""
    quick = {
        "name": "quick",
        "command": ["sh", "-c", "exit 0"],
        # The prober runs until the process is gone: the group kill comes after it returns.
        "readinessProbe": {"tcpSocket": {"port": free_port()}, "periodSeconds": 1},
    }
    slow = {"name": "slow", "command": ["sleep", "30"]}

    async def scenario() -> PodRunner:
        runner = PodRunner(pod([quick, slow]), Recorder().context(tmp_path))
        runner.start()
        await wait_until(lambda: runner.containers[0].done)
        runner.request_stop(1.0)
        assert runner.task is not None
        await runner.task
        return runner

    runner = asyncio.run(scenario())
    late = [(pgid, sig) for pgid, sig, unreaped in signals if not unreaped]
    assert not late, f"signalled after the leader was reaped: {late}"
    quick_pid = int(runner.containers[0].state["terminated"]["containerID"].split("//")[1])
    # Like a container's PID namespace, the exited container's group was killed (once).
    assert [s for s in signals if s[0] == quick_pid] == [(quick_pid, 9, True)]


def test_the_group_of_an_exited_container_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    container = {"name": "tree", "command": ["sh", "-c", f"sleep 300 & echo $! > {pid_file}"]}

    async def scenario() -> PodRunner:
        runner = PodRunner(pod([container]), Recorder().context(tmp_path))
        runner.start()
        assert runner.task is not None
        await asyncio.wait_for(runner.task, 30)
        return runner

    runner = asyncio.run(scenario())
    assert runner.status()["phase"] == "Succeeded"
    # The container ended only once its whole group was gone (the child is dead or a zombie).
    child = int(pid_file.read_text())
    assert not _running(child), f"the container's child {child} survived"


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def test_environment_follows_the_kubelet_rules(tmp_path: Path) -> None:
    spec = {
        "name": "main",
        "command": ["python", "-c", "$(GREETING)-$(MISSING)", "/dev/termination-log"],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "GREETING", "value": "$(CFG_word) $$(CFG_word)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {
                "name": "INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['index']"}},
            },
            {
                "name": "MILLICPU",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}},
            },
            {"name": "MEMORY", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}},
            {"name": "MESSAGE_TO", "value": "/dev/termination-log"},
        ],
        "resources": {"limits": {"cpu": "500m"}},
    }
    manifest = pod([spec])
    manifest["metadata"]["annotations"] = {"index": "3"}
    objects = {("ConfigMap", "settings"): {"word": "hi"}, ("Secret", "creds"): {"token": "s3"}}
    ctx = Recorder(objects).context(tmp_path)
    c = Container(spec, False, tmp_path / "main")
    launch = asyncio.run(PodEnvironment(manifest, ctx, tmp_path, [c]).launch(c))
    env = launch.env
    assert launch.argv[:3] == [sys.executable, "-c", "hi $(CFG_word)-$(MISSING)"]
    assert launch.argv[3] == env[TERMINATION_MESSAGE_ENV] == str(c.termination_file)
    assert env["MESSAGE_TO"] == str(c.termination_file)
    assert env["CFG_word"] == "hi"
    assert env["TOKEN"] == "s3"
    assert env["INDEX"] == "3"
    assert env["MILLICPU"] == "500"
    assert env["MEMORY"] == str(256 * 2**30)  # unset: the node's allocatable
    assert env["HOSTNAME"] == "p"
    assert launch.cwd == str(c.directory)

    missing = Recorder().context(tmp_path)
    with pytest.raises(ContainerConfigError, match='configmap "settings" not found'):
        asyncio.run(PodEnvironment(manifest, missing, tmp_path, [c]).launch(c))


def test_restart_policy_on_failure_restarts_with_back_off(tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    script = (
        f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); "
        "n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); "
        "sys.exit(0 if n >= 2 else 3)"
    )
    container = {"name": "flaky", "command": ["python", "-c", script]}

    async def scenario() -> PodRunner:
        ctx = Recorder().context(tmp_path)
        ctx.restart_backoff_max = 0.2
        runner = PodRunner(pod([container], restartPolicy="OnFailure"), ctx)
        runner.start()
        assert runner.task is not None
        await asyncio.wait_for(runner.task, 30)
        return runner

    runner = asyncio.run(scenario())
    status = runner.status()
    assert status["phase"] == "Succeeded"
    (c,) = status["containerStatuses"]
    assert c["restartCount"] == 2
    assert c["state"]["terminated"]["exitCode"] == 0
    assert c["lastState"]["terminated"]["exitCode"] == 3
