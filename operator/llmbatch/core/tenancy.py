"""Which tenants a pool serves: its ``tenants`` (namespaces by name or by label), one rule for the
gateway (create, ``/v1/models``, upload checks) and the operator (acceptance).

A pool without ``tenants`` serves every tenant. A pool with ``tenants`` serves a namespace that is
listed in ``namespaces`` or matched by ``namespaceSelector``; with neither set it serves nobody.
A pool whose ``tenants`` cannot be read serves nobody (fail closed: a private deployment never
opens up because of a typo).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from llmbatch.api.resources import NamespaceSelector, PoolTenants


@dataclass(frozen=True)
class Tenant:
    """A tenant as the rule sees it: its namespace and that namespace's labels."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)


def selects(selector: NamespaceSelector, labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy a label selector (every term, as Kubernetes evaluates it)."""
    for key, value in (selector.match_labels or {}).items():
        if labels.get(key) != value:
            return False
    for term in selector.match_expressions or []:
        present = term.key in labels
        values = set(term.values or [])
        if term.operator == "Exists" and not present:
            return False
        if term.operator == "DoesNotExist" and present:
            return False
        if term.operator == "In" and (not present or labels[term.key] not in values):
            return False
        if term.operator == "NotIn" and present and labels[term.key] in values:
            return False
    return True


def serves(tenants: PoolTenants | None, tenant: Tenant) -> bool:
    """Whether a pool with these ``tenants`` serves ``tenant``."""
    if tenants is None:
        return True
    if tenant.namespace in (tenants.namespaces or []):
        return True
    selector = tenants.namespace_selector
    return selector is not None and selects(selector, tenant.labels)


def pool_tenants(pool: Mapping[str, Any]) -> PoolTenants | None:
    """A pool object's ``spec.tenants``; one that does not parse serves nobody."""
    raw = (pool.get("spec") or {}).get("tenants")
    if raw is None:
        return None
    try:
        return PoolTenants.model_validate(raw)
    except ValidationError:
        return PoolTenants(namespaces=[])


def pool_serves(pool: Mapping[str, Any], tenant: Tenant) -> bool:
    """Whether the pool object serves ``tenant``."""
    return serves(pool_tenants(pool), tenant)


def needs_labels(pools: list[dict[str, Any]]) -> bool:
    """Whether any pool selects tenants by label (only then are a namespace's labels read)."""
    return any(
        (tenants := pool_tenants(pool)) is not None and tenants.namespace_selector is not None
        for pool in pools
    )
