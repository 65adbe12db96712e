"""The caller as a tenant of the pools (``llmbatch.core.tenancy``): its namespace, and that
namespace's labels when some pool selects tenants by label (otherwise nothing is read)."""

from __future__ import annotations

from typing import Any

from llmbatch.core.tenancy import Tenant, needs_labels
from llmbatch.gateway.deps import Gateway


async def caller_tenant(gw: Gateway, namespace: str, pools: list[dict[str, Any]]) -> Tenant:
    """The tenant ``namespace`` as ``pools``' ``tenants`` need to see it."""
    if not needs_labels(pools):
        return Tenant(namespace)
    return Tenant(namespace, await gw.kube.namespace_labels(namespace) or {})
