"""``helm install`` of the chart into a real control plane whose node agent runs the operator and
gateway pods as processes, under the chart's ServiceAccounts and RBAC.

One cluster for the module (its own, so no other operator shares the peering name); the tests run
in order: install → RBAC as the API server sees it → a batch completes → Pod Security dry-runs →
upgrade with a batch in flight → uninstall leaves no Job.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import build_slot_job
from llmbatch.core.keys import file_key
from llmbatch.devcluster import ClusterConfig, DevCluster, gpu_nodes
from llmbatch.storage.filesystem import FilesystemStore
from tests.fixtures.chart import (
    CHART,
    CLUSTER,
    RELEASE,
    RELEASE_NAMESPACE,
    helm,
    load_golden,
    render,
)
from tests.fixtures.cluster import kubectl, pids_with_environ, start_cluster
from tests.fixtures.operator import simulated_pool
from tests.fixtures.ports import free_port

WORKERS = "llmbatch-workers"
TENANT = "team-chart"
POOL = "chart-pool"
MODEL = "sim-chart"
OPERATOR_SA = "llmbatch-operator"
GATEWAY_SA = "llmbatch-gateway"


class Install:
    """The release on its cluster, and helpers to drive it."""

    def __init__(self, cluster: DevCluster, workdir: pathlib.Path) -> None:
        self.cluster = cluster
        self.kubeconfig = cluster.kubeconfig
        self.store_root = workdir / "store"
        self.values = workdir / "values.yaml"
        self.values.write_text(
            yaml.safe_dump(
                {
                    # The node agent runs commands, not images: any registry name will do.
                    "image": {"registry": "registry.example.com/llmbatch"},
                    "store": {"uri": f"file://{self.store_root}"},
                    "operator": {
                        "metricsPort": free_port(),
                        "healthPort": free_port(),
                        "reconcileIntervalSeconds": 1,
                        "progressIntervalSeconds": 1,
                    },
                    "gateway": {"port": free_port(), "metricsPort": free_port()},
                }
            )
        )

    def helm(self, *args: str, diagnose: Callable[[], str] | None = None) -> str:
        try:
            return helm(*args, "--kubeconfig", str(self.kubeconfig), timeout=400).stdout
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.diagnostics()}") from None

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        return kubectl(self.kubeconfig, *args, check=check, input=input).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps(obj))

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 180) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = probe()
            if result:
                return result
            time.sleep(1)
        raise AssertionError(f"timed out waiting for {what}\n{self.diagnostics()}")

    def diagnostics(self) -> str:
        pods = self.kubectl("get", "pods", "-A", "-o", "wide", check=False)
        logs = [
            f"--- {path.relative_to(self.cluster.pods_dir)}\n"
            + "\n".join(path.read_text(errors="replace").splitlines()[-40:])
            for path in sorted(self.cluster.pods_dir.glob(f"{RELEASE_NAMESPACE}_*/*/*.log"))
        ]
        return f"pods:\n{pods}\n" + "\n".join(logs)

    def batch(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.json("get", "batch", name, "-n", TENANT)
        return result

    def submit(self, count: int) -> str:
        name = f"batch-{uuid.uuid4().hex[:24]}"
        requests = [
            {
                "customID": f"req-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"ticket {i}"}],
                    "max_tokens": 8,
                },
            }
            for i in range(count)
        ]
        self.apply(
            {
                "apiVersion": "llmbatch.io/v1alpha1",
                "kind": "Batch",
                "metadata": {"name": name, "namespace": TENANT},
                "spec": {
                    "endpoint": "/v1/chat/completions",
                    "completionWindow": "24h",
                    "pool": POOL,
                    "requests": requests,
                },
            }
        )
        return name

    def wait_status(self, name: str, *statuses: str, timeout: float = 240) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            batch = self.batch(name)
            return batch if batch.get("status", {}).get("status") in statuses else None

        result: dict[str, Any] = self.wait(f"batch {name} in {statuses}", reached, timeout)
        return result

    def output_ids(self, status: dict[str, Any]) -> list[str]:
        data = FilesystemStore(self.store_root).get(file_key(TENANT, status["outputFileID"]))
        return [json.loads(line)["custom_id"] for line in data.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    workdir = tmp_path_factory.mktemp("chart-install")
    cluster = start_cluster(ClusterConfig(state_dir=workdir / "cluster", nodes=gpu_nodes(1)))
    try:
        release = Install(cluster, workdir)
        release.helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "-f",
            str(release.values),
            "--wait",
            "--timeout",
            "240s",
        )
        yield release
    finally:
        cluster.stop()


def test_install_runs_operator_and_gateway_as_their_service_accounts(install: Install) -> None:
    pods = install.json("get", "pods", "-n", RELEASE_NAMESPACE)["items"]
    accounts = {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"]["serviceAccountName"]
        for p in pods
        if p["status"].get("phase") == "Running"
    }
    assert accounts == {"operator": OPERATOR_SA, "gateway": GATEWAY_SA}
    classes = install.kubectl("get", "priorityclasses", "-o", "name")
    for tier in ("expedited", "standard", "flex"):
        assert f"priorityclass.scheduling.k8s.io/llmbatch-{tier}" in classes
    peering = install.json("get", "clusterkopfpeering", "llmbatch")
    assert peering["metadata"]["name"] == "llmbatch"


def _http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_metrics_on_their_own_port_never_on_the_api(install: Install) -> None:
    values = yaml.safe_load(install.values.read_text())["gateway"]
    assert _http_status(values["metricsPort"], "/metrics") == 200
    # The API port (behind the Service a LoadBalancer or Ingress exposes) has neither.
    assert _http_status(values["port"], "/metrics") == 404
    assert _http_status(values["port"], "/docs") == 404
    assert _http_status(values["port"], "/openapi.json") == 404
    services = install.json("get", "services", "-n", RELEASE_NAMESPACE)["items"]
    ports = {s["metadata"]["name"]: [p["name"] for p in s["spec"]["ports"]] for s in services}
    assert ports["llmbatch-gateway"] == ["http"]
    assert ports["llmbatch-gateway-metrics"] == ["metrics"]


def test_kopf_peering_crd_left_to_its_owner(install: Install) -> None:
    """``crds.kopfPeering: auto`` looks the CRD up: this release keeps rendering it (upgrades),
    another release on the same cluster leaves it alone instead of failing on its ownership."""

    def renders_peering_crd(release: str, namespace: str, *sets: str) -> bool:
        args = ["template", release, str(CHART), "-n", namespace, "-f", str(install.values)]
        for item in sets:
            args += ["--set", item]
        out = install.helm(*args, "--dry-run=server")
        return "name: clusterkopfpeerings.kopf.dev" in out

    assert renders_peering_crd(RELEASE, RELEASE_NAMESPACE)
    assert not renders_peering_crd("other", "other-system")
    assert renders_peering_crd("other", "other-system", "crds.kopfPeering=always")
    assert not renders_peering_crd(RELEASE, RELEASE_NAMESPACE, "crds.kopfPeering=never")


def _can_i(install: Install, account: str, namespace: str) -> dict[str, set[str]]:
    out = install.kubectl(
        "auth",
        "can-i",
        "--list",
        f"--as=system:serviceaccount:{RELEASE_NAMESPACE}:{account}",
        "-n",
        namespace,
    )
    rules: defaultdict[str, set[str]] = defaultdict(set)
    for line in out.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[[^\]]*\]\s+\[([^\]]*)\]\s+\[([^\]]*)\]\s*$", line)
        if not match or match[2]:
            continue  # non-resource URLs, or rules limited to resource names (none of ours)
        rules[match[1]] |= set(match[3].split())
    return rules


def test_live_rbac_matches_golden_rules(install: Install) -> None:
    golden = load_golden()
    # What every authenticated account may do anyway (self-reviews): not granted by the chart.
    install.kubectl("create", "serviceaccount", "nobody", "-n", RELEASE_NAMESPACE)
    baseline = {ns: _can_i(install, "nobody", ns) for ns in (RELEASE_NAMESPACE, WORKERS, "default")}
    for account, scopes in golden.items():
        for namespace in (RELEASE_NAMESPACE, WORKERS, "default"):
            expected: defaultdict[str, set[str]] = defaultdict(set)
            for scope in (CLUSTER, namespace):
                for resource, verbs in scopes.get(scope, {}).items():
                    expected[resource] |= set(verbs)
            live = _can_i(install, account, namespace)
            granted = {
                resource: verbs - baseline[namespace].get(resource, set())
                for resource, verbs in live.items()
            }
            granted = {r: v for r, v in granted.items() if v}
            assert granted == dict(expected), f"{account} in {namespace}"


def test_batch_completes_under_the_chart_rbac(install: Install) -> None:
    install.kubectl("create", "namespace", TENANT)
    install.apply(simulated_pool(POOL, MODEL, worker_namespace=WORKERS))
    name = install.submit(20)
    batch = install.wait_status(name, "completed")
    status = batch["status"]
    assert status["requestCounts"] == {"total": 20, "completed": 20, "failed": 0}
    assert sorted(install.output_ids(status)) == sorted(f"req-{i}" for i in range(20))
    events = install.kubectl("get", "events", "-n", TENANT)
    assert "Forbidden" not in events


def _dry_run(install: Install, obj: dict[str, Any], namespace: str) -> None:
    result = kubectl(
        install.kubeconfig,
        "create",
        "--dry-run=server",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(obj),
        check=False,
    )
    assert result.returncode == 0, f"{obj['kind']} rejected in {namespace}: {result.stderr}"
    assert "Warning" not in result.stderr, f"{obj['kind']} in {namespace}: {result.stderr}"


def _pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    spec = dict(template["spec"])
    spec.pop("serviceAccountName", None)  # the dry-run namespace's default account
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_pod_security_restricted_accepts_every_pod(install: Install) -> None:
    labels = install.json("get", "namespace", WORKERS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pool = BatchPoolSpec.model_validate(
        install.json("get", "batchpool", POOL)["spec"] | {"executor": {"engine": "simulated"}}
    )
    job = build_slot_job(
        config=OperatorConfig(
            store_uri="file:///s", executor_store_uri="file:///s", priority_class_prefix="llmbatch"
        ),
        pool_name=POOL,
        pool=pool,
        slot=f"{POOL}-slot-dryrun",
        spec_key=f"slots/{POOL}/{POOL}-slot-dryrun/spec.json",
    )
    job["metadata"].pop("namespace", None)
    _dry_run(install, job, WORKERS)
    _dry_run(install, _pod("executor-dryrun", job["spec"]["template"]), WORKERS)
    for obj in render():
        if obj["kind"] == "Deployment":
            pod = _pod(f"{obj['metadata']['name']}-dryrun", obj["spec"]["template"])
            _dry_run(install, pod, WORKERS)


def test_upgrade_with_a_batch_in_flight_loses_nothing(install: Install) -> None:
    slower = {"spec": {"executor": {"engineArgs": ["--latency-seconds=0.3"]}}}
    install.kubectl("patch", "batchpool", POOL, "--type=merge", "-p", json.dumps(slower))
    name = install.submit(60)
    install.wait_status(name, "in_progress")
    jobs = install.wait(
        "slot Jobs", lambda: install.json("get", "jobs", "-n", WORKERS)["items"], timeout=60
    )
    classes = {j["spec"]["template"]["spec"].get("priorityClassName") for j in jobs}
    assert classes == {"llmbatch-standard"}
    before = install.json(
        "get", "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/component=operator"
    )
    old_uids = {p["metadata"]["uid"] for p in before["items"]}
    install.helm(
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "-f",
        str(install.values),
        "--set",
        "operator.verbose=true",
        "--wait",
        "--timeout",
        "240s",
    )
    after = install.json(
        "get", "pods", "-n", RELEASE_NAMESPACE, "-l", "app.kubernetes.io/component=operator"
    )
    assert old_uids.isdisjoint(p["metadata"]["uid"] for p in after["items"]), (
        "operator not replaced"
    )
    status = install.wait_status(name, "completed", timeout=300)["status"]
    assert status["requestCounts"] == {"total": 60, "completed": 60, "failed": 0}
    ids = install.output_ids(status)
    assert len(ids) == len(set(ids)) == 60


def _restarts(install: Install, component: str) -> tuple[str, int]:
    (pod,) = install.json(
        "get", "pods", "-n", RELEASE_NAMESPACE, "-l", f"app.kubernetes.io/component={component}"
    )["items"]
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return pod["metadata"]["name"], int(statuses[0].get("restartCount", 0))


def test_killed_operator_and_gateway_containers_restart_and_lose_nothing(
    install: Install,
) -> None:
    """The crash case of the chart install: SIGKILL of the operator's and the gateway's
    container processes mid-batch; the kubelet (the node agent here) restarts them and the
    batch ends with every line exactly once."""
    name = install.submit(40)
    install.wait_status(name, "in_progress")
    for component in ("operator", "gateway"):
        pod, before = _restarts(install, component)
        pids = pids_with_environ(b"HOSTNAME=" + pod.encode() + b"\0")
        assert pids, f"no process of {pod}"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        install.wait(
            f"{component} restarted",
            lambda component=component, before=before: _restarts(install, component)[1] > before,
            timeout=120,
        )
    status = install.wait_status(name, "completed", timeout=300)["status"]
    assert status["requestCounts"] == {"total": 40, "completed": 40, "failed": 0}
    ids = install.output_ids(status)
    assert len(ids) == len(set(ids)) == 40


def test_uninstall_leaves_no_job(install: Install) -> None:
    name = install.submit(60)
    install.wait(
        "a slot Job",
        lambda: install.json("get", "jobs", "-n", WORKERS)["items"],
        timeout=120,
    )
    install.helm(
        "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "240s"
    )

    def no_jobs() -> bool:
        result = kubectl(install.kubeconfig, "get", "jobs", "-A", "-o", "json", check=False)
        items = json.loads(result.stdout)["items"] if result.returncode == 0 else [None]
        return not [j for j in items if j is None or j["metadata"]["namespace"] == WORKERS]

    install.wait("no Job left", no_jobs, timeout=180)
    assert not install.json("get", "deployments", "-n", RELEASE_NAMESPACE)["items"]
    # CRDs are kept (crds.keep), and with them the batch, to resume on a reinstall.
    assert install.batch(name)["metadata"]["name"] == name
