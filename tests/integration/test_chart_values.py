"""The chart's platform knobs, rendered by the pinned helm: a Gateway API HTTPRoute beside the
Ingress, name overrides, images by digest, pod labels, priority classes and topology spread per
component, security contexts as values with no uid pinned (OpenShift's restricted SCC assigns
one), and the recommended labels on every object."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from tests.fixtures.chart import CHART, ROOT, VALUE_SETS, helm, render

VALUES = ROOT / "hack" / "chart-values"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
UID_KEYS = {"runAsUser", "runAsGroup", "fsGroup"}


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]
        for o in objects
        if o["kind"] in WORKLOADS
    }


def test_an_httproute_sends_every_path_to_the_api_service() -> None:
    objects = render(VALUES / "httproute.yaml")
    route = _find(objects, "HTTPRoute", "llmbatch-gateway")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == [
        {"name": "shared-gateway", "namespace": "gateway-system", "sectionName": "https"}
    ]
    assert route["spec"]["hostnames"] == ["llmbatch.example.com"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    api = _find(objects, "Service", "llmbatch-gateway")
    assert rule["backendRefs"] == [
        {"name": "llmbatch-gateway", "port": api["spec"]["ports"][0]["port"]}
    ]
    assert rule["timeouts"] == {"request": "600s"}
    assert route["metadata"]["labels"]["gateway.example.com/exposed"] == "true"
    assert route["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"
    assert not [o for o in objects if o["kind"] == "Ingress"]
    assert not [o for o in render() if o["kind"] == "HTTPRoute"]  # off by default


def test_an_httproute_without_a_parent_fails_with_a_clear_message() -> None:
    args = ["template", "t", str(CHART), "-f", str(VALUES / "default.yaml")]
    result = helm(*args, "--set", "gateway.httpRoute.enabled=true", check=False)
    assert result.returncode != 0
    assert "gateway.httpRoute.parentRefs is required" in result.stderr, result.stderr


def test_name_overrides_digests_pod_labels_priority_and_spread() -> None:
    objects = render(VALUES / "overrides.yaml")
    names = {o["metadata"]["name"] for o in objects if o["kind"] in ("Deployment", "Service")}
    assert names == {
        "acme-batch-operator",
        "acme-batch-operator-metrics",
        "acme-batch-gateway",
        "acme-batch-gateway-metrics",
    }
    assert {o["metadata"]["labels"]["app.kubernetes.io/name"] for o in objects} == {
        "batch-inference"
    }
    pods = _pods(objects)
    registry = "registry.example.com/llmbatch"
    assert pods["operator"]["spec"]["containers"][0]["image"] == (
        f"{registry}/llm-batch-operator@sha256:{'0' * 63}1"
    )
    assert pods["gateway"]["spec"]["containers"][0]["image"] == (
        f"{registry}/llm-batch-gateway@sha256:{'0' * 63}2"
    )
    for component, pod in pods.items():
        assert pod["metadata"]["labels"]["team"] == "ml-platform"
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pods["operator"]["metadata"]["labels"]["cost-center"] == "4711"
    spread = pods["gateway"]["spec"]["topologySpreadConstraints"]
    assert spread[0]["topologyKey"] == "topology.kubernetes.io/zone"
    # The Deployment still selects its own pods: the selector is in the pod's labels.
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    plain = _pods(render())
    assert plain["operator"]["spec"]["containers"][0]["image"].endswith("llm-batch-operator:0.1.0")
    assert "priorityClassName" not in plain["gateway"]["spec"]
    assert "topologySpreadConstraints" not in plain["gateway"]["spec"]


def test_pod_labels_never_replace_the_charts_own() -> None:
    objects = render(
        sets=(
            "gateway.podLabels.app\\.kubernetes\\.io/component=other",
            "gateway.podLabels.app\\.kubernetes\\.io/instance=other",
        )
    )
    labels = _pods(objects)["gateway"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "gateway"
    assert labels["app.kubernetes.io/instance"] == "llmbatch"


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_no_pod_pins_a_uid_and_every_object_has_the_recommended_labels(
    values: pathlib.Path,
) -> None:
    """OpenShift's restricted SCC assigns the uid and fsGroup: a pinned one is refused there. The
    images' numeric USER keeps runAsNonRoot verifiable everywhere else."""
    objects = render(values)
    for component, pod in _pods(objects).items():
        contexts = [pod["spec"]["securityContext"]]
        contexts += [c["securityContext"] for c in pod["spec"]["containers"]]
        assert all(not UID_KEYS & set(ctx) for ctx in contexts), component
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True, component
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "llm-batch-operator", obj["kind"]
        assert labels["app.kubernetes.io/instance"], obj["kind"]
        assert labels["app.kubernetes.io/name"], obj["kind"]


def test_security_contexts_are_values() -> None:
    objects = render(
        sets=(
            "operator.podSecurityContext.runAsUser=1000740000",
            "gateway.containerSecurityContext.readOnlyRootFilesystem=true",
        )
    )
    pods = _pods(objects)
    assert pods["operator"]["spec"]["securityContext"]["runAsUser"] == 1000740000
    assert "runAsUser" not in pods["gateway"]["spec"]["securityContext"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("operator.digest=latest",), "does not match pattern"),
        (("gateway.httpRoute.hostnames=x",), "got string, want array"),
        (("gateway.priorityClassName[0]=x",), "want string"),
    ],
)
def test_schema_rejects_bad_platform_values(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART), "-f", str(VALUES / "default.yaml")]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
