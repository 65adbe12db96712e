"""The crash sweep on the stack ``llmbatch dev up`` starts, as users run it: the CLI starts its
supervisor with the control plane, the node agent and the components (setup, operator, gateway);
each iteration submits a batch through the gateway with the official SDK, SIGKILLs one victim —
the operator, the gateway, the batch's executor processes, the control plane (``apiserver``) or
the node agent — at a random moment while the batch runs, and checks the invariants once it has
ended (``tests/faults/crashsweep.py``; docs/reliability.md).

The demo pool serves SmolLM2 on the CPU vLLM engine, far too slow for a sweep: the iterations
run on a pool of the simulated engine applied with kubectl, as a user would add one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llmbatch.commands import devstack
from llmbatch.devcluster import DevCluster
from tests.faults.conftest import sweep_pool
from tests.faults.crashsweep import (
    ITERATIONS,
    VICTIMS,
    SweepFigures,
    http_ok,
    kill_all,
    supervised_pid,
    sweep_iteration,
)
from tests.faults.test_sweep import _pids_of_slots
from tests.fixtures.cluster import kubectl, require_binaries, track_cluster
from tests.fixtures.gateway import free_port, wait_for_key

REPO = Path(__file__).resolve().parents[2]
SLOT_POOL = "crash-sim"
"""The sweep's pool: its slots run the batches (the executor victim is their processes)."""
FIGURES = SweepFigures("devstack")


@dataclass
class DevStack:
    """The running ``dev up`` stack and how to break it."""

    cluster: DevCluster
    ports: devstack.StackPorts
    key: str
    name: str = "devstack"
    tenant: str = devstack.DEMO_TENANT
    victims: tuple[str, ...] = VICTIMS
    pool: str = SLOT_POOL

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.gateway}"

    def get_json(self, *args: str) -> Any:
        return json.loads(self.cluster.kubectl("get", *args, "-o", "json"))

    def _pids(self, victim: str, batch_uid: str) -> list[int]:
        if victim == "executor":
            return _pids_of_slots(SLOT_POOL)  # the slots running the batch (and maybe others)
        return supervised_pid(self.cluster.status(), victim)

    def kill(self, victim: str, batch_uid: str) -> list[int]:
        return kill_all(self._pids(victim, batch_uid))

    def healthy(self) -> list[str]:
        status = self.cluster.status()
        if not status["running"]:
            return [f"the supervisor is gone ({status.get('state')}: {status.get('error')})"]
        problems = [f"state {status.get('state')}"] if status.get("state") != "ready" else []
        components = status.get("components") or {}
        problems += [f"component {name} not running" for name, pid in components.items() if not pid]
        try:
            ready = self.cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10)
        except subprocess.TimeoutExpired:
            ready = ""
        if ready.strip() != "ok":
            problems.append("the API server is not ready")
        if not http_ok(f"{self.base_url}/healthz"):
            problems.append("the gateway does not answer /healthz")
        if not http_ok(f"http://127.0.0.1:{self.ports.operator_health}/healthz"):
            problems.append("the operator does not answer /healthz")
        return problems

    def explain(self) -> str:
        state_dir = self.cluster.state_dir
        logs = [state_dir / "supervisor.log", *sorted((state_dir / "logs").glob("*.log"))]
        tails = [f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs]
        return json.dumps(self.cluster.status(), indent=1) + "\n" + "\n".join(tails)


def _dev(state_dir: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``llmbatch dev ARGS --state-dir STATE_DIR`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", "dev", *args, "--state-dir", str(state_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
        check=False,
    )


def _demo_key(state_dir: Path) -> str:
    for line in (state_dir / devstack.DEMO_ENV_FILE).read_text().splitlines():
        if line.startswith("export OPENAI_API_KEY="):
            return line.split("=", 1)[1]
    raise AssertionError("no key in demo.env")


@pytest.fixture(scope="module")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    require_binaries()
    state_dir = tmp_path_factory.mktemp("crash-devstack")
    ports = devstack.StackPorts(free_port(), free_port(), free_port(), free_port())
    # Free ports instead of 8000/9090/9464/9465, so the sweep runs beside a user's stack.
    env = os.environ | {
        "LLMBATCH_DEV_GATEWAY_PORT": str(ports.gateway),
        "LLMBATCH_DEV_GATEWAY_METRICS_PORT": str(ports.gateway_metrics),
        "LLMBATCH_DEV_OPERATOR_METRICS_PORT": str(ports.operator_metrics),
        "LLMBATCH_DEV_OPERATOR_HEALTH_PORT": str(ports.operator_health),
    }
    cluster = track_cluster(DevCluster(state_dir))
    try:
        up = _dev(state_dir, env, "up", "--nodes", "1", "--gpus", "4", "--timeout", "240")
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"http://127.0.0.1:{ports.gateway}/v1" in up.stdout, up.stdout
        pool = sweep_pool(SLOT_POOL, devstack.WORKER_NAMESPACE)
        kubectl(cluster.kubeconfig, "apply", "-f", "-", input=json.dumps(pool))
        stack = DevStack(cluster, ports, _demo_key(state_dir))
        wait_for_key(stack.base_url, stack.key, accepted=True, timeout=60)
        yield stack
        print(FIGURES.summary())
    finally:
        down = _dev(state_dir, env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert cluster.leftover_processes() == []


@pytest.mark.parametrize("iteration", range(ITERATIONS))
def test_devstack_crash_sweep(
    dev_stack: DevStack, iteration: int, request: pytest.FixtureRequest
) -> None:
    sweep_iteration(dev_stack, FIGURES, iteration, request.node.nodeid)
