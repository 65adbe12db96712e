"""``helm install`` with the platform value sets on a real control plane: names from
``fullnameOverride``/``nameOverride``, images by digest, pod labels, a priority class and
topology spread (hack/chart-values/overrides.yaml) and OpenShift-style security contexts that pin
no uid in worker namespaces the platform made (openshift.yaml). The release comes up under those
names and a batch completes through it. (The HTTPRoute needs the Gateway API's CRDs, which this
control plane does not serve: test_chart_values.py renders it.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmbatch.devcluster import ClusterConfig, gpu_nodes
from tests.fixtures.chart import CHART, RELEASE, RELEASE_NAMESPACE, ROOT
from tests.fixtures.cluster import start_cluster
from tests.fixtures.operator import simulated_pool
from tests.integration.test_chart_install import MODEL, POOL, TENANT, WORKERS, Install

VALUES = ROOT / "hack" / "chart-values"
PREFIX = "acme-batch"  # overrides.yaml's fullnameOverride


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    workdir = tmp_path_factory.mktemp("chart-install-values")
    cluster = start_cluster(ClusterConfig(state_dir=workdir / "cluster", nodes=gpu_nodes(1)))
    try:
        release = Install(cluster, workdir)
        # openshift.yaml leaves the worker namespaces to the platform team.
        release.kubectl("create", "namespace", WORKERS)
        release.kubectl(
            "label", "namespace", WORKERS, "pod-security.kubernetes.io/enforce=restricted"
        )
        release.helm(
            "install", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE,
            "--create-namespace", "-f", str(VALUES / "overrides.yaml"),
            "-f", str(VALUES / "openshift.yaml"),
            "-f", str(release.values),  # this machine's ports, store and registry last
            # Pods are processes on one host here: one gateway, or its replicas share a port.
            "--set", "gateway.replicas=1",
            "--wait", "--timeout", "240s",
        )  # fmt: skip
        yield release
    finally:
        cluster.stop()


def _pods(install: Install) -> dict[str, dict[str, Any]]:
    pods = install.json("get", "pods", "-n", RELEASE_NAMESPACE)["items"]
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p
        for p in pods
        if p["status"].get("phase") == "Running"
    }


def test_the_release_runs_under_its_override_names_and_pod_values(install: Install) -> None:
    pods = _pods(install)
    assert set(pods) == {"operator", "gateway"}
    for component, pod in pods.items():
        assert pod["spec"]["serviceAccountName"] == f"{PREFIX}-{component}"
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] == "batch-inference"
        assert pod["metadata"]["labels"]["team"] == "ml-platform"
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
        assert "@sha256:" in pod["spec"]["containers"][0]["image"]
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(pod["spec"]["securityContext"])
    deployments = install.json("get", "deployments", "-n", RELEASE_NAMESPACE)["items"]
    assert {d["metadata"]["name"] for d in deployments} == {
        f"{PREFIX}-operator",
        f"{PREFIX}-gateway",
    }
    services = install.json("get", "services", "-n", RELEASE_NAMESPACE)["items"]
    assert f"{PREFIX}-gateway" in {s["metadata"]["name"] for s in services}


def test_a_batch_completes_through_the_overridden_release(install: Install) -> None:
    install.kubectl("create", "namespace", TENANT)
    install.apply(simulated_pool(POOL, MODEL, worker_namespace=WORKERS))
    name = install.submit(8)
    status = install.wait_status(name, "completed")["status"]
    assert status["requestCounts"] == {"total": 8, "completed": 8, "failed": 0}
    assert sorted(install.output_ids(status)) == sorted(f"req-{i}" for i in range(8))
    (job,) = install.json("get", "jobs", "-n", WORKERS)["items"]  # warm for idleSeconds
    assert job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "llm-batch-operator"
    assert job["metadata"]["labels"]["app.kubernetes.io/instance"] == POOL
