"""A pool's executor.podTemplate and suspended slot Jobs on the real control plane: the
template's fields on the slot pods the Job controller creates, the CRD's rules at apply time,
and a slot Job created suspended — Kueue's way of queueing it — that runs its shards once the
test, playing Kueue, resumes it (docs/kueue.md)."""

from __future__ import annotations

import base64
import json
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.cluster import pids_with_environ
from tests.fixtures.operator import WORKER_NAMESPACE, OperatorProcess, simulated_pool
from tests.integration.test_operator import (
    MODEL,
    apply,
    chat_requests,
    get_batch,
    kubectl_json,
    make_batch,
    pool_slots,
    read_lines,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def pool_name(cluster: Any) -> Iterator[str]:
    """A fresh pool name; the pool goes with the test."""
    name = f"pool-{uuid.uuid4().hex[:8]}"
    yield name
    cluster.kubectl("delete", "batchpool", name, "--wait=false", check=False)


def slot_pods(cluster: Any, pool: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(
        cluster, "get", "pods", "-n", WORKER_NAMESPACE, "-l", f"llmbatch.io/pool={pool}"
    )["items"]
    return items


TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {"team": "ml-platform", QUEUE_LABEL: "gpu-queue"},
        "annotations": {"example.com/cost-center": "4711"},
    },
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}
                ]
            }
        }
    },
    "tolerations": [{"key": "example.com/batch", "operator": "Exists", "effect": "NoSchedule"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "executor"}},
        }
    ],
    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
}


def test_a_suspended_slot_job_waits_for_admission_then_runs_its_shards_with_the_template(
    cluster: Any,
    namespace: str,
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
    pool_name: str,
) -> None:
    """A pool naming a Kueue queue: its slot Job is created suspended and has no pod; it waits
    (not removed, its shard held) until the test plays Kueue and resumes it; then the slot pod
    carries the template's labels, annotations, affinity, spread, tolerations and volume, and
    the batch completes with every line once."""
    pool = simulated_pool(
        pool_name,
        MODEL,
        maxSlots=1,
        shardRequests=10,
        throughputPerSlot="100",
        executor={"engineArgs": ["--latency-seconds=0.01"], "podTemplate": TEMPLATE},
    )
    apply(cluster, tmp_path, pool)
    name = make_batch(cluster, tmp_path, namespace, pool=pool_name, requests=chat_requests(6))
    (job,) = wait_for(lambda: pool_slots(cluster, pool_name), 60, "the slot Job")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][QUEUE_LABEL] == "gpu-queue"  # what Kueue admits it by
    # Waiting for admission: longer than the operator's slot lease (10 s), no pod, the Job kept.
    time.sleep(15)
    assert [j["metadata"]["uid"] for j in pool_slots(cluster, pool_name)] == [
        job["metadata"]["uid"]
    ]
    assert slot_pods(cluster, pool_name) == []
    assert get_batch(cluster, namespace, name)["status"]["status"] == "in_progress"

    patch = json.dumps({"spec": {"suspend": False}})  # admitted
    slot = job["metadata"]["name"]
    cluster.kubectl("patch", "job", slot, "-n", WORKER_NAMESPACE, "--type=merge", "-p", patch)
    status = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    assert status["requestCounts"] == {"total": 6, "completed": 6, "failed": 0}
    ids = [
        line["custom_id"]
        for line in read_lines(operator_process, namespace, status["outputFileID"])
    ]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(6))
    assert status["shards"][0]["job"] == slot

    (pod,) = slot_pods(cluster, pool_name)
    labels, spec = pod["metadata"]["labels"], pod["spec"]
    assert labels["team"] == "ml-platform"
    assert labels["app.kubernetes.io/name"] == "llm-batch-executor"
    assert labels["app.kubernetes.io/instance"] == pool_name
    assert labels["app.kubernetes.io/managed-by"] == "llm-batch-operator"
    assert pod["metadata"]["annotations"]["example.com/cost-center"] == "4711"
    assert spec["affinity"] == TEMPLATE["affinity"]
    assert spec["topologySpreadConstraints"] == TEMPLATE["topologySpreadConstraints"]
    assert TEMPLATE["tolerations"][0] in spec["tolerations"]
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "scratch", "mountPath": "/scratch"} in mounts


def test_the_slot_process_gets_its_variables_from_a_secret_and_the_pod(
    cluster: Any,
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
    pool_name: str,
) -> None:
    """env valueFrom: the node agent resolves it as a kubelet does, so the slot's own process
    holds the Secret's value and its node's name."""
    secret_name = f"{pool_name}-token"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": secret_name, "namespace": WORKER_NAMESPACE},
        "data": {"token": base64.b64encode(b"s3cr3t-for-the-slot").decode()},
    }
    apply(cluster, tmp_path, secret)
    env = [
        {
            "name": "EXAMPLE_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "token"}},
        },
        {"name": "EXAMPLE_NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    pool = simulated_pool(
        pool_name,
        MODEL,
        maxSlots=1,
        minSlots=1,
        idleSeconds=60,
        executor={"engineArgs": ["--latency-seconds=0.01"], "env": env},
    )
    apply(cluster, tmp_path, pool)

    def running() -> list[dict[str, Any]]:
        return [p for p in slot_pods(cluster, pool_name) if p["status"].get("phase") == "Running"]

    (pod,) = wait_for(running, 90, "the minSlots slot running", operator_process.logs)
    slot = pod["metadata"]["labels"]["llmbatch.io/slot"]
    pids = wait_for(
        lambda: pids_with_environ(f"LLMBATCH_SLOT={slot}\0".encode()), 30, "its process"
    )
    environ = pathlib.Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    assert b"EXAMPLE_TOKEN=s3cr3t-for-the-slot" in environ
    assert f"EXAMPLE_NODE={pod['spec']['nodeName']}".encode() in environ


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        (
            {
                "env": [
                    {
                        "name": "A",
                        "value": "x",
                        "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}},
                    }
                ]
            },
            "value and valueFrom are exclusive",
        ),
        (
            {"env": [{"name": "A", "valueFrom": {}}]},
            "exactly one of secretKeyRef, configMapKeyRef and fieldRef",
        ),
        (
            {"podTemplate": {"volumes": [{"name": "tmp", "emptyDir": {}}]}},
            "tmp, model-cache and dshm are the operator's volumes",
        ),
        (
            {
                "podTemplate": {
                    "volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]
                }
            },
            "exactly one of configMap, secret, emptyDir",
        ),
        (
            {"podTemplate": {"volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}},
            "every volumeMount names one of podTemplate.volumes",
        ),
        (
            {"podTemplate": {"metadata": {"labels": {"bad key!": "v"}}}},
            "labels keys must be [prefix/]name",
        ),
        (
            {"podTemplate": {"nodeSelector": {"zone/": "a"}}},
            "nodeSelector keys must be [prefix/]name",
        ),
        (
            {"podTemplate": {"metadata": {"labels": {"ok": "not a value"}}}},
            "should match",
        ),
    ],
    ids=[
        "value-and-valueFrom",
        "empty-valueFrom",
        "reserved-volume",
        "two-sources",
        "dangling-mount",
        "label-key",
        "node-selector-key",
        "label-value",
    ],
)
def test_the_api_server_refuses_a_template_kubernetes_would_refuse(
    cluster: Any,
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
    executor: dict[str, Any],
    message: str,
) -> None:
    """The CRD's rules refuse at apply time what would otherwise fail every slot Job's create
    (``operator_process`` applies the CRDs)."""
    pool = simulated_pool(f"pool-{uuid.uuid4().hex[:8]}", MODEL, executor=executor)
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(pool))
    out = cluster.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert message in out, out
