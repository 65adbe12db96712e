"""API shape lint of the generated CRDs (Kubernetes API conventions, Kueue-style)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from llmbatch.api.crd import build_crd
from llmbatch.api.resources import RESOURCES, BatchSpec

# Free-form maps allowed on purpose: user metadata, label selectors, a request body, the labels
# and annotations of slot pods, a CSI driver's attributes.
FREE_MAPS_ALLOWED = {
    "spec.metadata",
    "spec.nodeSelector",
    "spec.requests[].body",
    "spec.tenants.namespaceSelector.matchLabels",
    "spec.executor.podTemplate.metadata.labels",
    "spec.executor.podTemplate.metadata.annotations",
    "spec.executor.podTemplate.nodeSelector",
    "spec.executor.podTemplate.volumes[].csi.volumeAttributes",
}
#: A label selector's matchLabels is a map wherever a selector appears (affinity, spread).
SELECTOR_MAP = ".labelSelector.matchLabels", ".namespaceSelector.matchLabels"


def free_map_allowed(path: str) -> bool:
    return path in FREE_MAPS_ALLOWED or path.endswith(SELECTOR_MAP)


def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from walk(extra, f"{path}{{}}")


def schema_nodes() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for resource in RESOURCES:
        root = build_crd(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status"):
            for path, node in walk(root["properties"][part], part):
                yield resource.kind, path, node


NODES = list(schema_nodes())


def test_every_field_is_described() -> None:
    # Scalar list items and map values are described by their parent field.
    missing = [
        f"{k}:{p}"
        for k, p, n in NODES
        if not n.get("description")
        and not (p.endswith(("[]", "{}")) and n.get("type") in ("string", "integer", "boolean"))
    ]
    assert missing == []


def test_every_string_is_bounded() -> None:
    unbounded = [
        f"{k}:{p}"
        for k, p, n in NODES
        if n.get("type") == "string" and "maxLength" not in n and "enum" not in n
    ]
    assert unbounded == []


def test_every_list_is_bounded() -> None:
    unbounded = [
        f"{k}:{p}" for k, p, n in NODES if n.get("type") == "array" and "maxItems" not in n
    ]
    assert unbounded == []


def test_no_floats() -> None:
    assert [f"{k}:{p}" for k, p, n in NODES if n.get("type") == "number"] == []


def test_no_free_maps_but_the_allowed_ones() -> None:
    free = {
        p
        for _, p, n in NODES
        if n.get("type") == "object"
        and "properties" not in n
        and (n.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in n)
    }
    assert {p for p in free if not free_map_allowed(p)} == set()
    maps = [(k, p, n) for k, p, n in NODES if free_map_allowed(p) and "additionalProperties" in n]
    assert all("maxProperties" in n or p == "spec.nodeSelector" for _, p, n in maps)


@pytest.mark.parametrize("resource", RESOURCES, ids=lambda r: r.kind)
def test_status_subresource_printer_columns_conditions(resource: Any) -> None:
    crd = build_crd(resource)
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Age"}
    assert crd["spec"]["names"]["shortNames"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    conditions = status["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["items"]["properties"]["type"]["maxLength"] <= 316


def test_batch_immutable_fields_are_guarded_by_cel() -> None:
    batch = next(r for r in RESOURCES if r.kind == "Batch")
    spec = build_crd(batch)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    for field in BatchSpec.immutable:
        alias = BatchSpec.model_fields[field].alias or field
        rules = [r["rule"] for r in spec["properties"][alias]["x-kubernetes-validations"]]
        assert "self == oldSelf" in rules, alias
    assert "x-kubernetes-validations" not in spec["properties"]["cancel"]
    spec_rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    exactly_one = (
        "(has(self.inputFileID) ? 1 : 0) + (has(self.requests) ? 1 : 0)"
        " + (has(self.inlineInput) ? 1 : 0) == 1"
    )
    assert exactly_one in spec_rules


def test_batch_printer_columns_show_progress() -> None:
    batch = next(r for r in RESOURCES if r.kind == "Batch")
    columns = {
        c["name"]: c["jsonPath"]
        for c in build_crd(batch)["spec"]["versions"][0]["additionalPrinterColumns"]
    }
    assert columns["Status"] == ".status.status"
    assert columns["Completed"] == ".status.requestCounts.completed"
    assert columns["Total"] == ".status.requestCounts.total"
    assert columns["Priority"] == ".spec.priority"
