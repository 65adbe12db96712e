"""`llmbatch dev up` / `dev down` and the local stack on the real control plane: a stopped cluster
leaves nothing behind that could hurt the next one, and a crashed component is restarted while the
rest keeps serving (like the Deployments the components stand for)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest

from llmbatch.commands import devstack
from llmbatch.devcluster import ClusterConfig, ComponentSpec, DevCluster, DevClusterError, gpu_nodes
from tests.fixtures.cluster import kubectl, require_binaries, start_cluster
from tests.fixtures.gateway import free_port, wait_for_key
from tests.fixtures.operator import simulated_pool

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def dev(*args: str) -> subprocess.CompletedProcess[str]:
    """``llmbatch dev ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", "dev", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )


def test_dev_down_then_up_at_once(tmp_path: Path) -> None:
    """Reported: `dev down` then `dev up` at once failed with `control plane exited with -9` (the
    old run's watchdog, still polling for its supervisor, killed the new control plane)."""
    require_binaries()
    state = str(tmp_path / "dev")
    up = ["up", "--state-dir", state, "--nodes", "1", "--gpus", "1"]
    up += ["--skip", "setup", "--skip", "operator", "--skip", "gateway", "--timeout", "120"]
    cluster = DevCluster(Path(state))
    try:
        for attempt in range(3):
            started = dev(*up)
            assert started.returncode == 0, f"attempt {attempt}: {started.stdout}{started.stderr}"
            status = cluster.status()
            assert status["state"] == "ready"
            assert "gpu-node-0" in kubectl(cluster.kubeconfig, "get", "nodes").stdout
            stopped = dev("down", "--state-dir", state)
            assert stopped.returncode == 0, stopped.stderr
            # `dev down` returns once every process of the cluster is gone, its watchdog too.
            assert cluster.leftover_processes() == []
            assert not _running(status["watchdog_pid"]), "the watchdog outlived `dev down`"
            assert not _running(status["controlplane_pid"])
    finally:
        dev("down", "--state-dir", state)


def test_dev_down_while_dev_up_is_starting(tmp_path: Path) -> None:
    """`dev down` during a `dev up` stops the cluster at once instead of waiting for the start to
    finish (here: a component that never becomes ready holds the start)."""
    require_binaries()
    state = tmp_path / "dev"
    never_ready = ComponentSpec(
        name="never-ready",
        command=["sleep", "300"],
        ready_file="{state_dir}/never",
        ready_timeout=240,
    )
    cfg = ClusterConfig(
        state_dir=state, nodes=gpu_nodes(1, gpus=1, prefix="solo"), components=[never_ready]
    )
    failures: list[BaseException] = []

    def up() -> None:
        try:
            DevCluster.start(cfg, detach=True, timeout=240)
        except BaseException as err:  # the start fails: the cluster is stopped under it
            failures.append(err)

    starting = threading.Thread(target=up)
    starting.start()
    cluster = DevCluster(state)
    try:
        _wait(
            lambda: cluster.status().get("components", {}).get("never-ready"),
            120,
            "the never-ready component to be started",
            lambda: str(cluster.status()),
        )
        assert cluster.status()["state"] == "starting"
        began = time.monotonic()
        assert cluster.stop() is True
        assert time.monotonic() - began < 30
        assert cluster.leftover_processes() == []
        starting.join(60)
        assert len(failures) == 1, "dev up did not fail"
        assert isinstance(failures[0], DevClusterError), failures
        assert cluster.status()["state"] == "stopped"
    finally:
        cluster.stop()
        starting.join(60)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _wait(
    check: Callable[[], T | None], timeout: float, what: str, explain: Callable[[], str]
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{explain()}")
        time.sleep(0.5)


def _requests(model: str, n: int) -> bytes:
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"Summarize ticket {i}."}],
                "max_tokens": 8,
            },
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _demo_key(state_dir: Path) -> str:
    for line in (state_dir / devstack.DEMO_ENV_FILE).read_text().splitlines():
        if line.startswith("export OPENAI_API_KEY="):
            return line.split("=", 1)[1]
    raise AssertionError("no key in demo.env")


def test_a_killed_operator_comes_back_while_the_gateway_serves(tmp_path: Path) -> None:
    """kill -9 of the operator during `dev up`: the gateway keeps answering, the supervisor
    restarts the operator (logged and counted), and a batch submitted meanwhile completes."""
    ports = devstack.StackPorts(
        gateway=free_port(),
        gateway_metrics=free_port(),
        operator_metrics=free_port(),
        operator_health=free_port(),
    )
    state_dir = tmp_path / "stack"
    cfg = ClusterConfig(
        state_dir=state_dir,
        nodes=gpu_nodes(1, gpus=2, prefix="stack"),
        components=list(devstack.components(ports).values()),
    )
    cluster = start_cluster(cfg)

    def explain() -> str:
        logs = sorted((state_dir / "logs").glob("*.log"))
        tails = [f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs]
        supervisor = (state_dir / "supervisor.log").read_text(errors="replace")[-3000:]
        return f"{json.dumps(cluster.status(), indent=1)}\n{supervisor}\n" + "\n".join(tails)

    try:
        model = f"restart-{uuid.uuid4().hex[:6]}"
        pool = simulated_pool(f"pool-{model}", model, worker_namespace=devstack.WORKER_NAMESPACE)
        kubectl(cluster.kubeconfig, "apply", "-f", "-", input=json.dumps(pool))
        base_url = f"http://127.0.0.1:{ports.gateway}"
        key = _demo_key(state_dir)
        wait_for_key(base_url, key, accepted=True)
        client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
        before = cluster.status()
        operator, gateway = before["components"]["operator"], before["components"]["gateway"]

        os.kill(operator, signal.SIGKILL)
        # While the operator is down (or restarting) the gateway serves: upload, create, read.
        uploaded = client.files.create(file=("in.jsonl", _requests(model, 12)), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        def restarted() -> dict[str, Any] | None:
            client.batches.retrieve(batch.id)  # the gateway answers throughout
            status = cluster.status()
            pid = status["components"]["operator"]
            return status if pid and pid != operator else None

        after = _wait(restarted, 60, "the operator to be restarted", explain)
        assert after["restarts"]["operator"] == 1
        assert after["restarts"]["gateway"] == 0
        assert after["components"]["gateway"] == gateway
        assert after["state"] == "ready"
        supervisor_log = (state_dir / "supervisor.log").read_text()
        assert "component operator exited with -9" in supervisor_log

        def finished() -> Any:
            current = client.batches.retrieve(batch.id)
            return current if current.status in {"completed", "failed", "expired"} else None

        done = _wait(finished, 240, f"batch {batch.id} to finish", explain)
        assert done.status == "completed", explain()
        assert done.request_counts is not None
        assert done.request_counts.completed == 12
        assert cluster.status()["components"]["gateway"] == gateway
    finally:
        cluster.stop()
    assert cluster.leftover_processes() == []


def _pid_of(status: dict[str, Any], victim: str) -> int | None:
    pid = status.get("controlplane_pid") if victim == "controlplane" else None
    return pid or (status.get("components") or {}).get(victim)


@pytest.mark.parametrize("victim", ["controlplane", "node-agent"])
def test_a_killed_control_plane_or_node_agent_comes_back(tmp_path: Path, victim: str) -> None:
    """kill -9 of the control plane mid-batch: the supervisor restarts it on the same etcd data,
    certificates and port (``--keep-state``); the operator, the gateway and the node agent
    reconnect. kill -9 of the node agent (a process of its own): the supervisor restarts it, the
    new agent reports the pods its predecessor ran as failed (their processes died with it) and
    their Jobs replace them. Either way the batch completes with every line once."""
    ports = devstack.StackPorts(
        gateway=free_port(),
        gateway_metrics=free_port(),
        operator_metrics=free_port(),
        operator_health=free_port(),
    )
    state_dir = tmp_path / "stack"
    cfg = ClusterConfig(
        state_dir=state_dir,
        nodes=gpu_nodes(1, gpus=2, prefix="cp"),
        components=list(devstack.components(ports).values()),
    )
    cluster = start_cluster(cfg)

    def explain() -> str:
        logs = sorted((state_dir / "logs").glob("*.log"))
        tails = [f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs]
        supervisor = (state_dir / "supervisor.log").read_text(errors="replace")[-3000:]
        return f"{json.dumps(cluster.status(), indent=1)}\n{supervisor}\n" + "\n".join(tails)

    try:
        model = f"cp-{uuid.uuid4().hex[:6]}"
        pool = simulated_pool(
            f"pool-{model}",
            model,
            worker_namespace=devstack.WORKER_NAMESPACE,
            executor={"engineArgs": ["--latency-seconds=2"]},
        )
        kubectl(cluster.kubeconfig, "apply", "-f", "-", input=json.dumps(pool))
        base_url = f"http://127.0.0.1:{ports.gateway}"
        key = _demo_key(state_dir)
        wait_for_key(base_url, key, accepted=True)
        client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=8)
        uploaded = client.files.create(file=("in.jsonl", _requests(model, 20)), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        before = cluster.status()
        server = before["server"]

        def running_pod() -> bool:
            pods = kubectl(
                cluster.kubeconfig, "get", "pods", "-n", devstack.WORKER_NAMESPACE, "-o", "json"
            ).stdout
            return any(p["status"].get("phase") == "Running" for p in json.loads(pods)["items"])

        # Each request takes 2 s: a pod that runs is mid-shard when the victim dies.
        _wait(running_pod, 90, "an executor pod to run", explain)
        killed = _pid_of(before, victim)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)

        def restarted() -> dict[str, Any] | None:
            status = cluster.status()
            pid = _pid_of(status, victim)
            ok = pid and pid != killed and status["restarts"][victim] == 1
            return status if ok and _running(pid) else None

        after = _wait(restarted, 120, f"the {victim} to be restarted", explain)
        assert after["state"] == "ready"
        assert after["server"] == server, "the restarted API server moved"

        def finished() -> Any:
            try:
                current = client.batches.retrieve(batch.id)
            except openai.APIConnectionError:
                return None
            return current if current.status in {"completed", "failed", "expired"} else None

        done = _wait(finished, 240, f"batch {batch.id} to finish", explain)
        assert done.status == "completed", explain()
        assert done.request_counts is not None
        assert done.request_counts.completed == 20
        assert done.request_counts.failed == 0
        # The cluster's objects survived: the pool applied before the kill is still there.
        assert model in kubectl(cluster.kubeconfig, "get", "batchpools").stdout
        if victim == "node-agent":  # the pod that ran under the killed agent was replaced
            events = kubectl(
                cluster.kubeconfig, "get", "events", "-n", devstack.WORKER_NAMESPACE
            ).stdout
            assert "NodeAgentRestarted" in events, events
    finally:
        cluster.stop()
    assert cluster.leftover_processes() == []
