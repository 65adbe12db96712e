"""A pool's executor.podTemplate merged under the slot Job the operator builds: every field the
template shapes arrives, and every field the operator owns keeps the operator's value."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import build_slot_job, job_suspended, slot_revision
from llmbatch.core.podtemplate import merge_pod_template

CONFIG = OperatorConfig(
    store_uri="file:///s", executor_store_uri="file:///s", priority_class_prefix="llmbatch"
)
TEMPLATE: dict[str, Any] = {
    "metadata": {
        "labels": {
            "team": "ml-platform",
            "kueue.x-k8s.io/queue-name": "gpu-queue",
            "llmbatch.io/pool": "not-mine",
            "app.kubernetes.io/name": "not-mine",
        },
        "annotations": {"cost-center": "4711", "llmbatch.io/model": "not-mine"},
    },
    "nodeSelector": {"zone-class": "gold", "nvidia.com/gpu.product": "H100"},
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"llmbatch.io/pool": "p"}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        },
    },
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch"}],
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"llmbatch.io/pool": "p"}},
        }
    ],
    "priorityClassName": "batch-low",
    "volumes": [
        {"name": "certs", "secret": {"secretName": "ca-bundle", "defaultMode": 292}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
    ],
    "volumeMounts": [
        {"name": "certs", "mountPath": "/etc/ssl/custom", "readOnly": True},
        {"name": "scratch", "mountPath": "/tmp"},
    ],
}


def pool(template: dict[str, Any] | None = TEMPLATE, **executor: Any) -> BatchPoolSpec:
    spec = {
        "models": [{"name": "m", "source": "/models/m"}],
        "workerNamespace": "workers",
        "nodeSelector": {"nvidia.com/gpu.product": "A100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "executor": {
            "engine": "simulated",
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "LLMBATCH_SLOT", "value": "not-mine"},
            ],
            **({"podTemplate": template} if template is not None else {}),
            **executor,
        },
    }
    return BatchPoolSpec.model_validate(spec)


def job(spec: BatchPoolSpec) -> dict[str, Any]:
    return build_slot_job(
        config=CONFIG, pool_name="p", pool=spec, slot="p-slot-abc123", spec_key="slots/k"
    )


def test_every_shaped_field_reaches_the_slot_pod() -> None:
    built = job(pool())
    pod = built["spec"]["template"]
    spec = pod["spec"]
    for meta in (built["metadata"], pod["metadata"]):  # Kueue reads the Job's labels
        assert meta["labels"]["team"] == "ml-platform"
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert meta["annotations"]["cost-center"] == "4711"
    assert spec["affinity"] == TEMPLATE["affinity"]
    assert spec["topologySpreadConstraints"] == TEMPLATE["topologySpreadConstraints"]
    assert spec["priorityClassName"] == "batch-low"  # the pool's choice over the tier class
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "batch"},
    ]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["certs"] == {
        "name": "certs",
        "secret": {"secretName": "ca-bundle", "defaultMode": 292},
    }
    mounts = spec["containers"][0]["volumeMounts"]
    assert {"name": "certs", "mountPath": "/etc/ssl/custom", "readOnly": True} in mounts
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "t"}}
    assert env["NODE"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_fields_the_operator_owns_keep_its_values() -> None:
    built = job(pool())
    pod = built["spec"]["template"]
    spec = pod["spec"]
    for meta in (built["metadata"], pod["metadata"]):
        assert meta["labels"]["llmbatch.io/pool"] == "p"
        assert meta["labels"]["llmbatch.io/slot"] == "p-slot-abc123"
        assert meta["labels"]["app.kubernetes.io/name"] == "llm-batch-executor"
    # The pool's own nodeSelector wins on its key; the template adds the others.
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "A100", "zone-class": "gold"}
    # tmp stays the operator's emptyDir, mounted at /tmp; the template's tmp and its mount at
    # /tmp are left out, its other volumes stay.
    assert [v for v in spec["volumes"] if v["name"] == "tmp"] == [{"name": "tmp", "emptyDir": {}}]
    mounts = spec["containers"][0]["volumeMounts"]
    assert [m for m in mounts if m["mountPath"] == "/tmp"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert "scratch" in {v["name"] for v in spec["volumes"]}
    env = [e for e in spec["containers"][0]["env"] if e["name"] == "LLMBATCH_SLOT"]
    assert env == [{"name": "LLMBATCH_SLOT", "value": "p-slot-abc123"}]
    plain = job(pool(None))
    container, bare = spec["containers"][0], plain["spec"]["template"]["spec"]["containers"][0]
    for field in ("command", "args", "resources", "securityContext", "envFrom"):
        assert container.get(field) == bare.get(field), field
    assert spec["securityContext"] == plain["spec"]["template"]["spec"]["securityContext"]
    assert built["spec"]["podFailurePolicy"] == plain["spec"]["podFailurePolicy"]


def test_slot_jobs_carry_the_recommended_labels() -> None:
    labels = job(pool(None))["spec"]["template"]["metadata"]["labels"]
    assert labels == {
        "llmbatch.io/pool": "p",
        "llmbatch.io/slot": "p-slot-abc123",
        "app.kubernetes.io/name": "llm-batch-executor",
        "app.kubernetes.io/instance": "p",
        "app.kubernetes.io/component": "executor",
        "app.kubernetes.io/part-of": "llm-batch-operator",
        "app.kubernetes.io/managed-by": "llm-batch-operator",
    }
    assert job(pool(None))["metadata"]["labels"] == labels


@pytest.mark.parametrize(
    ("template", "executor", "suspended"),
    [
        (None, {}, False),
        (None, {"createSuspended": True}, True),
        ({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q"}}}, {}, True),
        ({"metadata": {"labels": {"team": "a"}}}, {}, False),
    ],
)
def test_created_suspended_when_the_pool_asks_or_names_a_kueue_queue(
    template: dict[str, Any] | None, executor: dict[str, Any], suspended: bool
) -> None:
    built = job(pool(template, **executor))
    assert job_suspended(built) is suspended
    assert ("suspend" in built["spec"]) is suspended


def test_no_template_leaves_the_job_as_the_operator_built_it() -> None:
    built = job(pool(None))
    assert merge_pod_template(built, None) is built
    assert "affinity" not in built["spec"]["template"]["spec"]
    assert built["spec"]["template"]["spec"]["priorityClassName"] == "llmbatch-standard"


def test_a_template_edit_retires_the_slots_started_before_it() -> None:
    """The template shapes the pod, so it is part of the slot revision: after an edit new slots
    get the new shape and the old ones drain (docs/pools.md)."""
    before = slot_revision(CONFIG, pool(None), "m")
    after = slot_revision(CONFIG, pool(), "m")
    assert before != after
    assert slot_revision(CONFIG, pool(None, createSuspended=True), "m") == before
