"""The crash sweep on the chart install: ``helm install`` of the chart onto the local control plane
(as ``tests/integration/test_chart_install.py`` does), whose node agent runs the operator and
gateway pods as processes; each iteration submits a batch through the chart's gateway with the
official SDK, SIGKILLs one victim — the operator's or the gateway's container, the batch's
executor processes, the API server or the node agent — at a random moment while the batch runs,
and checks the invariants once it has ended (``tests/faults/crashsweep.py``).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from llmbatch.devcluster import ClusterConfig, gpu_nodes
from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
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
from tests.fixtures.chart import CHART, RELEASE, RELEASE_NAMESPACE
from tests.fixtures.cluster import pids_with_environ, start_cluster
from tests.fixtures.gateway import wait_for_key
from tests.integration.test_chart_install import WORKERS, Install

SLOT_POOL = "crash-chart"
"""The sweep's pool: its slots run the batches (the executor victim is their processes)."""
TENANT = "team-crash"
FIGURES = SweepFigures("chart")


@dataclass
class ChartStack:
    """The release on its cluster and how to break it."""

    release: Install
    port: int
    key: str
    name: str = "chart"
    tenant: str = TENANT
    victims: tuple[str, ...] = VICTIMS
    pool: str = SLOT_POOL

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get_json(self, *args: str) -> Any:
        return self.release.json("get", *args)

    def _ready_pods(self, component: str) -> list[str]:
        pods = self.get_json(
            "pods", "-n", RELEASE_NAMESPACE, "-l", f"app.kubernetes.io/component={component}"
        )["items"]
        return [
            p["metadata"]["name"]
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and all(s.get("ready") for s in p["status"].get("containerStatuses") or [{}])
        ]

    def _pids(self, victim: str, batch_uid: str) -> list[int]:
        if victim == "executor":
            return _pids_of_slots(SLOT_POOL)  # the slots running the batch (and maybe others)
        if victim in ("operator", "gateway"):
            with contextlib.suppress(Exception):  # the API server may be restarting
                for pod in self._ready_pods(victim):
                    return pids_with_environ(b"HOSTNAME=" + pod.encode() + b"\0")
            return []
        return supervised_pid(self.release.cluster.status(), victim)

    def kill(self, victim: str, batch_uid: str) -> list[int]:
        return kill_all(self._pids(victim, batch_uid))

    def healthy(self) -> list[str]:
        status = self.release.cluster.status()
        if not status["running"]:
            return [f"the supervisor is gone ({status.get('state')}: {status.get('error')})"]
        components = status.get("components") or {}
        problems = [f"{name} not running" for name, pid in components.items() if not pid]
        try:
            for component in ("operator", "gateway"):
                if not self._ready_pods(component):
                    problems.append(f"no ready {component} pod")
        except Exception as err:
            problems.append(f"the API server does not answer: {err}")
        if not http_ok(f"{self.base_url}/healthz"):
            problems.append("the gateway does not answer /healthz")
        return problems

    def explain(self) -> str:
        supervisor = self.release.cluster.state_dir / "supervisor.log"
        return (
            self.release.diagnostics()
            + f"\n--- supervisor.log\n{supervisor.read_text(errors='replace')[-3000:]}"
        )


def _tenant(release: Install) -> str:
    """The tenant namespace, a key for it (a Secret the chart's gateway reads), its credit."""
    release.kubectl("create", "namespace", TENANT)
    key = new_api_key()
    scopes = ["inference:write", "inference:read"]
    release.apply(key_secret("key-crash", hash_key(key), TENANT, scopes, RELEASE_NAMESPACE))
    release.apply(
        {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "CreditAccount",
            "metadata": {"name": "default", "namespace": TENANT},
            "spec": {"limit": "1000"},
        }
    )
    return key


@pytest.fixture(scope="module")
def chart_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartStack]:
    workdir = tmp_path_factory.mktemp("crash-chart")
    cluster = start_cluster(ClusterConfig(state_dir=workdir / "cluster", nodes=gpu_nodes(1)))
    try:
        release = Install(cluster, workdir)
        release.helm(
            "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
            "--create-namespace", "-f", str(release.values), "--wait", "--timeout", "240s",
        )  # fmt: skip
        pool = sweep_pool(SLOT_POOL, WORKERS)
        release.apply(pool)
        port = int(yaml.safe_load(release.values.read_text())["gateway"]["port"])
        stack = ChartStack(release, port, _tenant(release))
        wait_for_key(stack.base_url, stack.key, accepted=True, timeout=60)
        yield stack
        print(FIGURES.summary())
    finally:
        with contextlib.suppress(subprocess.SubprocessError, AssertionError):
            release.helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait")
        cluster.stop()
    assert cluster.leftover_processes() == []


@pytest.mark.parametrize("iteration", range(ITERATIONS))
def test_chart_crash_sweep(
    chart_stack: ChartStack, iteration: int, request: pytest.FixtureRequest
) -> None:
    sweep_iteration(chart_stack, FIGURES, iteration, request.node.nodeid)
