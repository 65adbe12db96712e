"""The dev cluster is a real control plane: Jobs run through the real Job controller, scheduler and
the process node agent; RBAC and CRD validation are the apiserver's own."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import textwrap
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.devcluster import ClusterConfig, ComponentSpec, DevCluster, gpu_nodes
from tests.fixtures.cluster import Kube, kubectl, start_cluster

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def job(name: str, script: str, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "python:3.11-slim",  # ignored by the node agent
        "command": ["python", "-c", textwrap.dedent(script)],
    }
    container.update(spec.pop("container", {}))
    pod_spec: dict[str, Any] = {
        "restartPolicy": spec.pop("restartPolicy", "Never"),
        "terminationGracePeriodSeconds": spec.pop("terminationGracePeriodSeconds", 5),
        "containers": [container],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": {"spec": pod_spec}, **spec},
    }


def test_nodes_are_gpu_nodes(kube: Kube) -> None:
    nodes = json.loads(kube.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 2
    for node in nodes:
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
        assert "nvidia.com/gpu.product" in node["metadata"]["labels"]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True"
        assert not [t for t in node["spec"].get("taints") or [] if "not-ready" in t["key"]]


def test_indexed_job_runs_to_completion(kube: Kube) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "stringData": {"token": "s3cret"},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"MODE": "fast", "greeting": "hello"},
        },
    )
    script = """
        import os, sys
        assert os.environ["TOKEN"] == "s3cret", os.environ
        assert os.environ["MODE"] == "fast"
        assert os.getcwd() == os.environ["WORKDIR"], (os.getcwd(), os.environ["WORKDIR"])
        env = os.environ
        message = " ".join([sys.argv[1], env["POD_NAME"], env["JOB_COMPLETION_INDEX"]])
        print("writing", message, flush=True)
        with open("/dev/termination-log", "w") as f:
            f.write(message)
    """
    workdir = kube.cluster.state_dir / "work" / kube.namespace
    manifest = job(
        "twice",
        script,
        completions=2,
        parallelism=2,
        completionMode="Indexed",
        container={
            "args": ["$(GREETING)-$(MISSING)"],
            "workingDir": str(workdir),
            "env": [
                {"name": "WORKDIR", "value": str(workdir)},
                {
                    "name": "TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}},
                },
                {
                    "name": "GREETING",
                    "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}},
                },
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "envFrom": [{"configMapRef": {"name": "settings"}}],
        },
    )
    kube.apply(manifest)
    finished = kube.wait_job("twice", "Complete", timeout=90)
    assert finished["status"]["succeeded"] == 2
    pods = kube.pods("job-name=twice")
    succeeded = [p for p in pods if p["status"]["phase"] == "Succeeded"]
    assert len(succeeded) == 2, kube.diagnostics()
    messages = set()
    for pod in succeeded:
        (status,) = pod["status"]["containerStatuses"]
        terminated = status["state"]["terminated"]
        assert terminated["exitCode"] == 0
        assert terminated["reason"] == "Completed"
        messages.add(terminated["message"])
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions["PodScheduled"] == "True"
        assert conditions["Initialized"] == "True"
        assert conditions["Ready"] == "False"
        assert pod["spec"]["nodeName"].startswith("gpu-node-")
        assert "writing hello-$(MISSING)" in kube.pod_logs(pod["metadata"]["name"])
    # kubectl logs goes apiserver -> the node agent's kubelet endpoint.
    assert (
        "writing hello-$(MISSING)" in kube.kubectl("logs", succeeded[0]["metadata"]["name"]).stdout
    )
    indexes = sorted(m.rsplit(" ", 1)[1] for m in messages)
    assert indexes == ["0", "1"]
    assert all(m.startswith("hello-$(MISSING) twice-") for m in messages)


def test_too_many_gpus_stays_pending(kube: Kube) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "greedy"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "none",
                        "command": ["python", "-c", "pass"],
                        "resources": {"limits": {"nvidia.com/gpu": "16"}},
                    }
                ]
            },
        }
    )

    def failed_scheduling() -> dict[str, Any] | None:
        for event in kube.events():
            if event.get("reason") == "FailedScheduling":
                return event
        return None

    event = kube.wait_for(failed_scheduling, timeout=30, what="a FailedScheduling event")
    assert "nvidia.com/gpu" in event["message"]
    pod = kube.get("pod", "greedy")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_backoff_limit_and_pod_failure_policy(kube: Kube) -> None:
    # backoffLimit 1: the first failure is retried once (after the Job controller's 10s back-off).
    kube.apply(job("flaky", "import sys; sys.exit(3)", backoffLimit=1))
    # A podFailurePolicy rule on exit code 42 fails the Job at once despite backoffLimit 6.
    kube.apply(
        job(
            "fatal",
            "import sys; sys.exit(42)",
            backoffLimit=6,
            podFailurePolicy={
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "main",
                            "operator": "In",
                            "values": [42],
                        },
                    }
                ]
            },
        )
    )
    # restartPolicy OnFailure: the node agent restarts the container; restarts count as failures.
    kube.apply(
        job("restarts", "import sys; sys.exit(1)", backoffLimit=2, restartPolicy="OnFailure")
    )

    fatal = kube.wait_job("fatal", "Failed", timeout=60)
    reasons = {c["type"]: c.get("reason") for c in fatal["status"]["conditions"]}
    assert reasons["Failed"] == "PodFailurePolicy"
    assert fatal["status"].get("failed", 0) == 1

    flaky = kube.wait_job("flaky", "Failed", timeout=90)
    reasons = {c["type"]: c.get("reason") for c in flaky["status"]["conditions"]}
    assert reasons["Failed"] == "BackoffLimitExceeded"
    assert flaky["status"]["failed"] == 2
    exit_codes = [
        p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
        for p in kube.pods("job-name=flaky")
    ]
    assert exit_codes == [3, 3]

    restarts = kube.wait_job("restarts", "Failed", timeout=90)
    reasons = {c["type"]: c.get("reason") for c in restarts["status"]["conditions"]}
    assert reasons["Failed"] == "BackoffLimitExceeded"


def test_deleting_a_running_job_sends_sigterm(kube: Kube, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = f"""
        import os, signal, sys, time
        marker = {str(marker)!r}
        def stop(signum, frame):
            with open(marker, "a") as f:
                f.write("SIGTERM\\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        with open(marker, "w") as f:
            f.write(f"started {{os.getpid()}}\\n")
        time.sleep(600)
    """
    kube.apply(job("sleeper", script, terminationGracePeriodSeconds=10))
    started = kube.wait_for(
        lambda: marker.read_text() if marker.exists() else None,
        timeout=60,
        what="the pod process to start",
    )
    pid = int(started.split()[1])
    kube.wait_for(
        lambda: any(p["status"].get("phase") == "Running" for p in kube.pods("job-name=sleeper")),
        timeout=30,
        what="pod Running",
    )
    kube.kubectl("delete", "job", "sleeper", "--wait=false")
    kube.wait_for(
        lambda: "SIGTERM" in marker.read_text(), timeout=30, what="SIGTERM seen by the process"
    )
    kube.wait_for(lambda: not _alive(pid), timeout=15, what=f"process {pid} to exit")
    kube.wait_for(
        lambda: not kube.pods("job-name=sleeper"), timeout=30, what="the pod to be removed"
    )


def test_active_deadline_kills_pod(kube: Kube) -> None:
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "slow"},
            "spec": {
                "restartPolicy": "Never",
                "activeDeadlineSeconds": 2,
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "main", "image": "none", "command": ["sleep", "300"]},
                ],
            },
        }
    )
    pod = kube.wait_pod_phase("slow", "Failed", timeout=30)
    assert pod["status"]["reason"] == "DeadlineExceeded"
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 143


def test_rbac_denies_service_account(kube: Kube, kube_api: Any) -> None:
    user = f"system:serviceaccount:{kube.namespace}:default"
    result = kube.kubectl("get", "secrets", f"--as={user}", check=False)
    assert result.returncode != 0
    assert "Forbidden" in result.stderr, result.stderr
    assert (
        kube.kubectl("auth", "can-i", "list", "secrets", f"--as={user}", check=False).stdout.strip()
        == "no"
    )

    async def as_service_account() -> int:
        api = await kube_api()
        try:
            api.set_default_header("Impersonate-User", user)
            try:
                await client.CoreV1Api(api).list_namespaced_secret(kube.namespace)
            except ApiException as err:
                return int(err.status)
            return 200
        finally:
            await api.close()

    assert asyncio.run(as_service_account()) == 403

    # Granting the right through a RoleBinding makes the same request succeed.
    kube.kubectl("create", "role", "read-secrets", "--verb=list", "--resource=secrets")
    kube.kubectl(
        "create",
        "rolebinding",
        "read-secrets",
        "--role=read-secrets",
        f"--serviceaccount={kube.namespace}:default",
    )
    kube.wait_for(
        lambda: kube.kubectl("get", "secrets", f"--as={user}", check=False).returncode == 0,
        timeout=10,
        what="RBAC to allow the service account",
    )


INLINE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.devcluster.llmbatch.io"},
    "spec": {
        "group": "devcluster.llmbatch.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "required": ["min", "max"],
                                "properties": {
                                    "min": {"type": "integer"},
                                    "max": {"type": "integer"},
                                },
                                "x-kubernetes-validations": [
                                    {
                                        "rule": "self.min <= self.max",
                                        "message": "min must not exceed max",
                                    }
                                ],
                            }
                        },
                    }
                },
            }
        ],
    },
}


def _validation_messages(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or []:
            if "message" in rule:
                found.add(rule["message"])
        for value in node.values():
            found |= _validation_messages(value)
    elif isinstance(node, list):
        for value in node:
            found |= _validation_messages(value)
    return found


def test_crds_apply_and_validate(kube: Kube, dev_cluster: DevCluster) -> None:
    crd_files = sorted((REPO / "crds").glob("*.yaml"))
    kubectl(dev_cluster.kubeconfig, "apply", "-f", "-", input=yaml.safe_dump(INLINE_CRD))
    for path in crd_files:
        kubectl(dev_cluster.kubeconfig, "apply", "--server-side", "-f", str(path))
    names = [INLINE_CRD["metadata"]["name"]]  # type: ignore[index]
    names += [yaml.safe_load(p.read_text())["metadata"]["name"] for p in crd_files]
    kubectl(
        dev_cluster.kubeconfig,
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        *[f"crd/{n}" for n in names],
    )

    good = {
        "apiVersion": "devcluster.llmbatch.io/v1",
        "kind": "Widget",
        "metadata": {"name": "ok"},
        "spec": {"min": 1, "max": 2},
    }
    kube.apply(good)
    bad = {**good, "metadata": {"name": "bad"}, "spec": {"min": 3, "max": 2}}
    result = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert result.returncode != 0
    assert "min must not exceed max" in result.stderr, result.stderr
    assert "Invalid" in result.stderr

    batches = [p for p in crd_files if p.name.startswith("batches.")]
    if batches:
        crd = yaml.safe_load(batches[0].read_text())
        version = next(v for v in crd["spec"]["versions"] if v.get("served"))
        invalid = {
            "apiVersion": f"{crd['spec']['group']}/{version['name']}",
            "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "invalid"},
            # Neither an input file nor inline requests, and not a known endpoint.
            "spec": {"endpoint": "/v1/nope"},
        }
        result = kube.kubectl("apply", "-f", "-", input=json.dumps(invalid), check=False)
        assert result.returncode != 0, "the Batch CRD accepted an invalid object"
        assert "Invalid" in result.stderr, result.stderr
        messages = _validation_messages(version)
        assert any(m in result.stderr for m in messages) or "Unsupported value" in result.stderr


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigkilled_supervisor_leaves_no_process(tmp_path: Path) -> None:
    """A second cluster with a plugged-in component; SIGKILL its supervisor while a pod runs a
    process tree: the watchdog and PR_SET_PDEATHSIG take everything down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    web = ComponentSpec(
        name="web",
        command=["{python}", "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=str(tmp_path),
        ready_url=f"http://127.0.0.1:{port}/",
    )
    cfg = ClusterConfig(
        state_dir=tmp_path / "cluster", nodes=gpu_nodes(1, gpus=1, prefix="solo"), components=[web]
    )
    cluster = start_cluster(cfg)
    try:
        assert cluster.status()["components"]["web"] > 0
        kubectl(
            cluster.kubeconfig,
            "run",
            "tree",
            "--image=none",
            "--restart=Never",
            "--command",
            "--",
            "sh",
            "-c",
            "sleep 300 & sleep 301",
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cmdlines = [_cmdline(p) for p in cluster.leftover_processes()]
            if any("sleep 300" in c for c in cmdlines) and any("sleep 301" in c for c in cmdlines):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"pod processes did not start: {cmdlines}")
        assert any("http.server" in c for c in cmdlines)
        assert cluster.process is not None
        os.kill(cluster.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while cluster.leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {p: _cmdline(p) for p in cluster.leftover_processes()}
        assert not left, f"processes survived the supervisor: {left}"
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "a"),
        ("x$(A)y$(B)", "xayb"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$(A", "$(A"),
        ("$x", "$x"),
        ("100$", "100$"),
    ],
)
def test_expansion_matches_kubelet(text: str, expected: str) -> None:
    from llmbatch.devcluster.expansion import expand

    assert expand(text, {"A": "a", "B": "b"}) == expected


def test_quantities_and_python_resolution() -> None:
    from llmbatch.devcluster.podenv import parse_quantity, resolve_command

    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("4Gi") == 4 * 2**30
    assert parse_quantity("2") == 2
    assert parse_quantity("1e3") == 1000
    assert resolve_command(["python3", "-V"], None) == [sys.executable, "-V"]
    assert resolve_command(["python3.11", "-V"], None)[0] == sys.executable
    assert resolve_command(["sh", "-c", "true"], "/usr/bin:/bin")[0].endswith("/sh")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_readiness_probe_gates_ready(kube: Kube) -> None:
    port = _free_port()
    # Serves only after 3 s: Ready must wait for the probe, not for the process to start.
    server = (
        "import time, http.server as h; time.sleep(3); "
        f"h.test(h.SimpleHTTPRequestHandler, port={port}, bind='127.0.0.1')"
    )
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
    for name, probe_port in (("served", port), ("unserved", _free_port())):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "none",
                            "command": (
                                ["python", "-c", server] if name == "served" else ["sleep", "300"]
                            ),
                            "ports": [{"name": "http", "containerPort": probe_port}],
                            "readinessProbe": probe,
                        }
                    ],
                },
            }
        )
    kube.wait_pod_phase("served", "Running")
    assert not _ready(kube.get("pod", "served"))
    kube.wait_for(lambda: _ready(kube.get("pod", "served")), timeout=30, what="served Ready")
    unserved = kube.wait_pod_phase("unserved", "Running")
    time.sleep(3)
    unserved = kube.get("pod", "unserved")
    assert not _ready(unserved)
    assert unserved["status"]["containerStatuses"][0]["ready"] is False


def test_pod_gets_its_service_account_token(kube: Kube) -> None:
    ns = kube.namespace
    kube.kubectl("create", "serviceaccount", "reader")
    kube.kubectl("create", "role", "pod-reader", "--verb=list", "--resource=pods")
    kube.kubectl(
        "create", "rolebinding", "reader", "--role=pod-reader", f"--serviceaccount={ns}:reader"
    )
    script = """
        import json, os, subprocess, sys
        def kubectl(*args):
            return subprocess.run([sys.argv[1], *args], capture_output=True, text=True)
        who = kubectl("auth", "whoami", "-o", "json")
        pods = kubectl("get", "pods", "-o", "name")
        secrets = kubectl("get", "secrets")
        print(json.dumps({
            "user": json.loads(who.stdout)["status"]["userInfo"]["username"],
            "pods": pods.returncode,
            "secrets": secrets.returncode,
            "forbidden": "Forbidden" in secrets.stderr,
            "kubeconfig": os.environ.get("KUBECONFIG", ""),
        }))
    """
    manifest = job("whoami", script, backoffLimit=0)
    pod_spec = manifest["spec"]["template"]["spec"]
    pod_spec["serviceAccountName"] = "reader"
    pod_spec["containers"][0]["args"] = [str(REPO / ".cache" / "bin" / "kubectl")]
    kube.apply(manifest)
    kube.wait_job("whoami", "Complete", timeout=60)
    pod = kube.pods("job-name=whoami")[0]["metadata"]["name"]
    out = json.loads(kube.pod_logs(pod).strip().splitlines()[-1])
    assert out["user"] == f"system:serviceaccount:{ns}:reader"
    assert out["pods"] == 0
    assert out["secrets"] != 0
    assert out["forbidden"] is True
    assert out["kubeconfig"].endswith("/kubeconfig")
    assert "/volumes/kube-api-access-" in out["kubeconfig"]


def _zombie_children(parent: int) -> list[int]:
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = stat_file.read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] == "Z" and int(fields[1]) == parent:
            found.append(int(stat_file.parent.name))
    return found


def test_orphans_of_a_finished_pod_are_reaped(kube: Kube, dev_cluster: DevCluster) -> None:
    """When a container's main process ends, the rest of its group is killed; those children
    are adopted by the supervisor (a child subreaper) and must be reaped there, or every pod
    that forks leaves zombies behind until a long `dev up` runs out of pids."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "forks"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "none",
                        "command": ["sh", "-c", "sleep 300 & sleep 301 & sleep 1"],
                    }
                ],
            },
        }
    )
    kube.wait_pod_phase("forks", "Succeeded", timeout=60)
    supervisor = dev_cluster.status()["pid"]
    kube.wait_for(
        lambda: not _zombie_children(supervisor),
        timeout=15,
        what=f"the supervisor's adopted zombies to be reaped: {_zombie_children(supervisor)}",
    )


def test_the_client_lists_jobs_and_pods_as_the_api_sent_them(kube: Kube) -> None:
    """``KubeClient.list_jobs`` / ``list_pods`` parse the API's JSON once (no generated models):
    the same objects kubectl sees, camelCase, selected by label; an API error is the
    ``ApiException`` with its status, as for every other call."""
    from llmbatch.kube import KubeClient

    for name, labels in (("listed", {"app": "listed"}), ("other", {"app": "other"})):
        manifest = job(name, "print('hi')", suspend=True)
        manifest["metadata"]["labels"] = labels
        manifest["spec"]["template"]["metadata"] = {"labels": labels}
        kube.apply(manifest)

    async def go() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
        client = await KubeClient.connect(str(kube.kubeconfig))
        try:
            jobs = await client.list_jobs(kube.namespace, "app=listed")
            pods = await client.list_pods(kube.namespace, "app=listed")
            try:
                await client.list_jobs(kube.namespace, "app in (")  # a bad selector: 400
                status = None
            except ApiException as exc:
                status = exc.status
            return jobs, pods, status
        finally:
            await client.close()

    jobs, pods, status = asyncio.run(go())
    expected = kube.get("jobs", selector="app=listed")
    assert [j["metadata"]["name"] for j in jobs] == ["listed"]
    assert jobs[0]["metadata"]["uid"] == expected[0]["metadata"]["uid"]
    assert jobs[0]["spec"]["suspend"] is True  # camelCase fields, as sent
    assert jobs[0]["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert pods == []  # suspended: no pod
    assert status == 400


def test_the_client_writes_our_objects_and_events_as_the_api_answers(kube: Kube) -> None:
    """Creates, patches, status writes and Events go through ``call_json`` (the answer parsed
    once, no generated models): each returns the object as the API wrote it, a write on a
    stale resourceVersion or a taken name is :class:`Conflict`, one on a missing object None
    (or False), and an Event lands on its object."""
    from llmbatch.kube import KubeClient
    from llmbatch.kube.client import Conflict

    kube.kubectl("apply", "-f", str(REPO / "crds"))
    kube.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s", "crd/creditaccounts.llmbatch.io"
    )
    body = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "CreditAccount",
        "metadata": {"name": "default"},
        "spec": {"limit": "10", "currency": "USD"},
    }
    namespace = kube.namespace

    async def go() -> dict[str, Any]:
        api = await KubeClient.connect(str(kube.kubeconfig))
        try:
            created = await api.create_custom("creditaccounts", namespace, body)
            with pytest.raises(Conflict):
                await api.create_custom("creditaccounts", namespace, body)
            written = await api.replace_custom_status(
                "creditaccounts", namespace, "default", {**created, "status": {"reserved": "1"}}
            )
            assert written is not None
            assert written["status"]["reserved"] == "1"
            with pytest.raises(Conflict):  # the version before that write
                await api.replace_custom_status(
                    "creditaccounts", namespace, "default", {**created, "status": {}}
                )
            with pytest.raises(Conflict):  # a patch with that precondition: the same rule
                await api.patch_custom_at(
                    "creditaccounts",
                    namespace,
                    "default",
                    {"metadata": {"labels": {"x": "y"}}},
                    created["metadata"]["resourceVersion"],
                )
            patched = await api.patch_custom(
                "creditaccounts", namespace, "default", {"metadata": {"labels": {"a": "b"}}}
            )
            assert patched is not None
            assert patched["metadata"]["labels"] == {"a": "b"}
            assert await api.patch_custom("creditaccounts", namespace, "none", {}) is None
            assert not await api.patch_custom_status("creditaccounts", namespace, "none", {})
            involved = {
                "apiVersion": "llmbatch.io/v1alpha1",
                "kind": "CreditAccount",
                "namespace": namespace,
                "name": "default",
                "uid": created["metadata"]["uid"],
            }
            assert await api.post_event(
                involved, "Tested", "an Event", warning=False, component="test"
            )
            return written
        finally:
            await api.close()

    written = asyncio.run(go())
    events = kube.get("events")
    assert [e["reason"] for e in events if e["involvedObject"]["name"] == "default"] == ["Tested"]
    assert written["metadata"]["uid"] == kube.get("creditaccounts")[0]["metadata"]["uid"]


def test_a_status_put_of_the_replacement_writes_what_the_merge_patch_writes(kube: Kube) -> None:
    """The batch steps PUT ``status_replacement(body, patch)`` where they merge-patched
    ``{"status": patch}`` before: on two equal Batches, the two writes leave the same status,
    spec, labels, annotations and field ownership (the status strategy keeps the stored
    metadata and spec whatever the PUT's body says), and a PUT on a stale version is a
    :class:`Conflict`, as the patch with a precondition was."""
    from llmbatch.api.resources.base import API_VERSION
    from llmbatch.kube import KubeClient, status_replacement
    from llmbatch.kube.client import Conflict
    from tests.fixtures.operator import paused_operators

    kube.kubectl("apply", "-f", str(REPO / "crds"))
    kube.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/batches.llmbatch.io")
    namespace = kube.namespace
    requests = [
        {
            "customID": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        }
        for i in range(3)
    ]

    def manifest(name: str) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "Batch",
            "metadata": {
                "name": name,
                "labels": {"llmbatch.io/pool": "p"},
                "annotations": {"note": "kept"},
            },
            "spec": {"endpoint": "/v1/chat/completions", "pool": "p", "requests": requests},
        }

    def replacement(body: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
        return status_replacement(body, patch, api_version=API_VERSION, kind="Batch")

    first = {"status": "validating", "requestCounts": {"total": 3, "completed": 0, "failed": 0}}
    second = {"status": "in_progress", "requestCounts": {"completed": 2}, "inProgressAt": 7}

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        api = await KubeClient.connect(str(kube.kubeconfig))
        try:
            await api.create_custom("batches", namespace, manifest("batch-by-patch"))
            put = created = await api.create_custom("batches", namespace, manifest("batch-by-put"))
            for patch in (first, second):
                assert await api.patch_custom_status(
                    "batches", namespace, "batch-by-patch", {"status": patch}
                )
                written = await api.replace_custom_status(
                    "batches", namespace, "batch-by-put", replacement(put, patch)
                )
                assert written is not None
                put = written
            with pytest.raises(Conflict):  # the version the first write was decided on
                await api.replace_custom_status(
                    "batches", namespace, "batch-by-put", replacement(created, {"status": "failed"})
                )
            patched = await api.get_custom("batches", namespace, "batch-by-patch")
            assert patched is not None
            return patched, put
        finally:
            for name in ("batch-by-patch", "batch-by-put"):  # gone before an operator resumes
                await api.delete_custom("batches", namespace, name)
            await api.close()

    with paused_operators():  # the session's operator would step these Batches meanwhile
        patched, put = asyncio.run(go())
    assert (
        put["status"]
        == patched["status"]
        == {
            "status": "in_progress",
            "requestCounts": {"total": 3, "completed": 2, "failed": 0},
            "inProgressAt": 7,
        }
    )
    assert put["spec"] == patched["spec"]
    for field in ("labels", "annotations", "finalizers", "generation"):
        assert put["metadata"].get(field) == patched["metadata"].get(field), field

    def owners(obj: dict[str, Any]) -> list[str]:
        return sorted(
            json.dumps([m.get("manager"), m.get("operation"), m.get("subresource"), m["fieldsV1"]])
            for m in obj["metadata"]["managedFields"]
        )

    assert owners(put) == owners(patched)
