"""The Helm chart, rendered by the pinned helm: lint, templates over several value sets, the strict
values schema, secure pod defaults and the golden RBAC rules."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.fixtures.chart import (
    CHART,
    CLUSTER,
    GOLDEN_RBAC,
    ROOT,
    VALUE_SETS,
    dump_grants,
    granted,
    helm,
    load_golden,
    render,
)

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in WORKLOADS
    ]


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_lint_and_template(values: pathlib.Path) -> None:
    helm("lint", "--strict", str(CHART), "-f", str(values))
    objects = render(values)
    kinds = {o["kind"] for o in objects}
    assert "Deployment" in kinds
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]


def test_default_install_has_every_part() -> None:
    objects = render()
    by_kind: dict[str, list[str]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
    assert {f"{n}.yaml" for n in by_kind["CustomResourceDefinition"]} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }
    assert sorted(by_kind["PriorityClass"]) == [
        "llmbatch-expedited",
        "llmbatch-flex",
        "llmbatch-standard",
    ]
    assert by_kind["Namespace"] == ["llmbatch-workers"]
    assert sorted(by_kind["Deployment"]) == ["llmbatch-gateway", "llmbatch-operator"]
    operator = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "llmbatch-operator"
    )
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LLMBATCH_PRIORITY_CLASS_PREFIX"] == "llmbatch"
    assert {p["name"] for p in container["ports"]} == {"metrics", "health"}
    workers = next(o for o in objects if o["kind"] == "Namespace")
    assert workers["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_crds_follow_enabled_and_keep() -> None:
    kept = [o for o in render() if o["kind"] == "CustomResourceDefinition"]
    assert kept
    assert all(o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for o in kept)
    dropped = [
        o for o in render(sets=("crds.keep=false",)) if o["kind"] == "CustomResourceDefinition"
    ]
    assert dropped
    assert all("annotations" not in o["metadata"] for o in dropped)
    assert not [
        o for o in render(sets=("crds.enabled=false",)) if o["kind"] == "CustomResourceDefinition"
    ]


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_every_pod_is_restricted(values: pathlib.Path) -> None:
    specs = pod_specs(render(values))
    assert specs
    for name, spec in specs:
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True, name
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert container["command"], f"{name}: the command must not rely on the image"
            assert container.get("resources", {}).get("limits", {}).get("memory"), name


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("operator.replicas=2",), "additional properties 'replicas' not allowed"),
        (("gateway.port=http",), "got string, want integer"),
        (("image.pullPolicy=Sometimes",), "value must be one of"),
        (("workerNamespaces.names[0]=Bad_Name",), "does not match pattern"),
        (("typo=1",), "additional properties 'typo' not allowed"),
    ],
)
def test_schema_rejects_bad_values(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_values_schema_and_readme_are_generated() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values)


def test_rbac_matches_golden_file() -> None:
    rendered = granted(render())
    assert rendered == load_golden(), (
        f"RBAC changed; if intended, review it and write:\n{dump_grants(rendered)}\n"
        f"to {GOLDEN_RBAC.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_rbac_is_least_privilege(values: pathlib.Path) -> None:
    objects = render(values)
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            assert not FORBIDDEN_VERBS & set(rule["verbs"]), where
            assert "*" not in rule["resources"], where
            assert "*" not in rule["apiGroups"], where
            assert "resourceNames" not in rule or rule["resourceNames"], where
            if obj["kind"] == "ClusterRole":
                assert "secrets" not in rule["resources"], f"{where}: cluster-wide Secret access"
    grants = granted(objects)
    for account, scopes in grants.items():
        for scope, resources in scopes.items():
            if scope != CLUSTER:
                continue
            assert "jobs.batch" not in resources, f"{account}: Jobs outside worker namespaces"
            assert "pods" not in resources, f"{account}: Pods outside worker namespaces"
