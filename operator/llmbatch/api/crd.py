"""Build CustomResourceDefinitions from the pydantic models in :mod:`llmbatch.api.resources`.

Pydantic's JSON schema is turned into a Kubernetes *structural* schema: ``$ref``s inlined,
``Optional`` collapsed, ``Any`` maps marked ``x-kubernetes-preserve-unknown-fields``, scalar
defaults kept, titles dropped, and CEL rules added for immutable spec fields.
"""

from __future__ import annotations

from typing import Any

from llmbatch.api.resources import (
    API_VERSION,
    GROUP,
    MAX_COMPLETION_WINDOW,
    VERSION,
    BatchSpec,
    ResourceKind,
)

_KEEP_KEYS = (
    "description",
    "maxLength",
    "minLength",
    "pattern",
    "minimum",
    "maximum",
    "x-kubernetes-validations",  # a model's CEL rules (its json_schema_extra)
)
_LIST_KEYS = {"minItems": "minItems", "maxItems": "maxItems"}
_MAP_KEYS = {"minProperties": "minProperties", "maxProperties": "maxProperties"}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    target = dict(defs[ref.rsplit("/", 1)[-1]])
    # A $ref next to a description (pydantic's style for documented sub-models) keeps the
    # field's own description over the model's.
    if "description" in schema:
        target["description"] = schema["description"]
    return target


def to_structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Convert one pydantic JSON-schema node into a structural OpenAPI v3 node."""
    schema = _resolve(schema, defs)
    variants = schema.get("anyOf")
    if variants is not None:
        return to_structural(_unwrap_optional(schema, variants, defs), defs)

    out: dict[str, Any] = {key: schema[key] for key in _KEEP_KEYS if key in schema}
    if "const" in schema:
        out["type"] = "string"
        out["enum"] = [schema["const"]]
    elif "enum" in schema:
        out["type"] = "string"
        out["enum"] = list(schema["enum"])
    out.update(_typed_keys(schema, defs, typed="type" in out))
    default = schema.get("default")
    if isinstance(default, str | int | bool) and not isinstance(default, dict | list):
        out["default"] = default
    return out


def _unwrap_optional(
    schema: dict[str, Any], variants: list[dict[str, Any]], defs: dict[str, Any]
) -> dict[str, Any]:
    """``Optional[X]`` is ``anyOf: [X, null]``: X, keeping the field's description and default."""
    non_null = [v for v in variants if v.get("type") != "null"]
    if len(non_null) != 1:
        raise ValueError(f"unions are not structural: {schema}")
    inner = dict(_resolve(non_null[0], defs))
    for key in ("description", "default"):
        if key in schema:
            inner[key] = schema[key]
    return inner


def _typed_keys(schema: dict[str, Any], defs: dict[str, Any], *, typed: bool) -> dict[str, Any]:
    """The keys a node's JSON type brings; ``typed``: an enum already gave the node its type."""
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _object_keys(schema, defs)
    if kind == "array":
        out: dict[str, Any] = {"type": "array", "items": to_structural(schema["items"], defs)}
        out.update({target: schema[key] for key, target in _LIST_KEYS.items() if key in schema})
        return out
    if kind == "integer":
        return {"type": "integer", "format": "int64"}
    if kind in ("string", "boolean"):
        return {"type": kind}
    if kind == "number":
        raise ValueError("floats are not allowed in CRDs; use a decimal string")
    if not typed:
        raise ValueError(f"cannot convert schema node: {schema}")
    return {}


def _object_keys(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A model (its properties) or a map (its value schema, or any value preserved)."""
    out: dict[str, Any] = {"type": "object"}
    props = schema.get("properties")
    if props is not None:
        out["properties"] = {name: to_structural(sub, defs) for name, sub in props.items()}
        required = schema.get("required")
        if required:
            out["required"] = list(required)
        return out
    extra = schema.get("additionalProperties", True)
    if extra is True or extra == {}:
        out["x-kubernetes-preserve-unknown-fields"] = True
    else:
        out["additionalProperties"] = to_structural(extra, defs)
    out.update({target: schema[key] for key, target in _MAP_KEYS.items() if key in schema})
    return out


def model_schema(model: type[Any]) -> dict[str, Any]:
    """The structural schema of a pydantic model (by alias, as the API sees it)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return to_structural(raw, defs)


#: Lists that are maps by a key: ``conditions`` by type, a pool's ``tenants`` by namespace (the
#: API server then refuses two items with the same key, which CEL could not afford to check).
LIST_MAP_KEYS = {"conditions": "type", "tenants": "namespace"}


def _annotate_conditions(node: dict[str, Any]) -> None:
    """Mark every list of :data:`LIST_MAP_KEYS` as a map by its key (server-side apply
    friendly, keys unique)."""
    props = node.get("properties", {})
    for name, child in props.items():
        key = LIST_MAP_KEYS.get(name)
        if key and child.get("type") == "array" and key in child["items"].get("properties", {}):
            child["x-kubernetes-list-type"] = "map"
            child["x-kubernetes-list-map-keys"] = [key]
        _annotate_conditions(child)
    if "items" in node:
        _annotate_conditions(node["items"])


def _batch_rules(spec: dict[str, Any]) -> None:
    props = spec["properties"]
    spec["x-kubernetes-validations"] = [
        {
            "rule": "(has(self.inputFileID) ? 1 : 0) + (has(self.requests) ? 1 : 0)"
            " + (has(self.inlineInput) ? 1 : 0) == 1",
            "message": "exactly one of inputFileID, requests and inlineInput must be set",
        }
    ]
    for field in BatchSpec.immutable:
        alias = BatchSpec.model_fields[field].alias or field
        props[alias].setdefault("x-kubernetes-validations", []).append(
            {"rule": "self == oldSelf", "message": f"{alias} is immutable"}
        )
        if alias not in spec.get("required", []) and "default" not in props[alias]:
            spec["x-kubernetes-validations"].append(
                {
                    "rule": f"has(self.{alias}) == has(oldSelf.{alias})",
                    "message": f"{alias} is immutable",
                }
            )
    props["metadata"].setdefault("x-kubernetes-validations", []).append(
        {"rule": "self.all(k, size(k) <= 64)", "message": "metadata keys are at most 64 characters"}
    )
    props["completionWindow"].setdefault("x-kubernetes-validations", []).append(
        {
            "rule": f"duration(self) <= duration('{MAX_COMPLETION_WINDOW}')",
            "message": f"completionWindow is at most {MAX_COMPLETION_WINDOW}",
        }
    )


def build_crd(resource: ResourceKind) -> dict[str, Any]:
    """The CustomResourceDefinition of one kind."""
    spec = model_schema(resource.spec)
    status = model_schema(resource.status)
    spec["description"] = (resource.spec.__doc__ or "").strip()
    status["description"] = (resource.status.__doc__ or "").strip()
    if resource.kind == "Batch":
        _batch_rules(spec)
    _annotate_conditions(spec)
    _annotate_conditions(status)
    root: dict[str, Any] = {
        "description": resource.description,
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{API_VERSION}"},
            "kind": {"type": "string", "description": resource.kind},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if resource.rules:
        root["x-kubernetes-validations"] = [dict(rule) for rule in resource.rules]
    columns = []
    for column in resource.printer_columns:
        entry: dict[str, Any] = {k: v for k, v in column.items() if k != "priority"}
        if "priority" in column:
            entry["priority"] = int(column["priority"])
        columns.append(entry)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{resource.plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.singular,
                "shortNames": list(resource.short_names),
                "categories": ["llmbatch"],
            },
            "scope": resource.scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
