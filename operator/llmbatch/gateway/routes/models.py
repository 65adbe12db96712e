"""``/v1/models``: the catalog of models the BatchPools serve, with their tiers and limits."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import ValidationError as PydanticValidationError

from llmbatch.api.openai import GENERATE_ENDPOINTS, POOLING_ENDPOINTS
from llmbatch.api.resources import BatchPoolSpec
from llmbatch.core.admission import max_requests
from llmbatch.core.tenancy import Tenant, pool_serves
from llmbatch.gateway.deps import GW, Reader
from llmbatch.gateway.errors import not_found
from llmbatch.gateway.mapping import k8s_time
from llmbatch.gateway.responses import ERROR_RESPONSES, json_data
from llmbatch.gateway.tenants import caller_tenant

log = logging.getLogger(__name__)

router = APIRouter(responses=ERROR_RESPONSES)

_TIER_WINDOWS = (("standard", "24h"), ("flex", "72h"), ("expedited", "24h"))


@router.get("/models")
async def list_models(who: Reader, gw: GW) -> Response:
    """The model catalog: every model a BatchPool serves to the caller (``batch`` is non-null)."""
    pools = await gw.kube.list_pools()
    tenant = await caller_tenant(gw, who.namespace, pools)
    return json_data({"object": "list", "data": model_catalog(pools, tenant)})


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, who: Reader, gw: GW) -> Response:
    pools = await gw.kube.list_pools()
    tenant = await caller_tenant(gw, who.namespace, pools)
    for entry in model_catalog(pools, tenant):
        if entry["id"] == model_id:
            return json_data(entry)
    raise not_found("model", model_id, "model")


def model_catalog(pools: list[dict[str, Any]], tenant: Tenant) -> list[dict[str, Any]]:
    """``GET /v1/models`` data: one entry per model a pool serves to ``tenant`` (another
    tenant's private deployment is left out, as if it did not exist); ``batch`` names the
    pools and ``batch.kind`` says how it is billed."""
    entries: dict[str, dict[str, Any]] = {}
    for pool in sorted(pools, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        if not pool_serves(pool, tenant):
            continue
        meta = pool.get("metadata") or {}
        spec = pool.get("spec") or {}
        cap = _catalog_max_requests(spec)
        if cap is None:
            continue
        for model in spec.get("models") or []:
            model_id = str(model.get("name") or "")
            if not model_id:
                continue
            if model_id in entries:
                entries[model_id]["batch"]["pools"].append(meta.get("name"))
            else:
                entries[model_id] = _entry(model_id, meta, spec, model, cap, tenant)
    return [entries[k] for k in sorted(entries)]


def _entry(
    model_id: str,
    meta: dict[str, Any],
    spec: dict[str, Any],
    model: dict[str, Any],
    cap: int,
    tenant: Tenant,
) -> dict[str, Any]:
    """A model's catalog entry, from the first pool (by name) serving it: a ``catalog`` model
    (token prices per tier) or a ``deployment`` (GPUTime billing: GPU time, no token charge).
    OpenAI's ``owned_by`` names the caller's organization for a deployment that names its
    tenants (the caller's own), else the platform."""
    tiers = _tiers(spec)
    endpoints = list(POOLING_ENDPOINTS if model.get("runner") == "pooling" else GENERATE_ENDPOINTS)
    billing = spec.get("billing") or {}
    deployment = billing.get("mode") == "GPUTime"
    kind: dict[str, Any] = {"kind": "deployment" if deployment else "catalog"}
    if deployment:
        kind["gpu_hour_price"] = billing.get("gpuHourPrice", "0")
    return {
        "id": model_id,
        "object": "model",
        "created": k8s_time(meta.get("creationTimestamp")) or 0,
        "owned_by": tenant.namespace if deployment and spec.get("tenants") else "llmbatch",
        "batch": {
            **kind,
            "pool": meta.get("name"),
            "pools": [meta.get("name")],
            "revision": model.get("revision"),
            "endpoints": endpoints,
            "input_modalities": model.get("inputModalities") or ["text"],
            "tiers": tiers,
            "expedited": "expedited" in tiers,
            "limits": {
                "max_requests": cap,
                "max_bytes": (spec.get("limits") or {}).get("maxBytes", 268435456),
            },
        },
    }


def _tiers(spec: dict[str, Any]) -> dict[str, Any]:
    tiers_spec = spec.get("tiers") or {}
    tiers: dict[str, Any] = {}
    for tier, window in _TIER_WINDOWS:
        if tier == "expedited" and spec.get("expeditedAllowed") is False:
            continue
        pricing = (tiers_spec.get(tier) or {}).get("pricing") or {}
        tiers[tier] = {
            "completion_window": window,
            "currency": pricing.get("currency", "USD"),
            "input_per_million": pricing.get("inputPerMillion", "0"),
            "output_per_million": pricing.get("outputPerMillion", "0"),
        }
    return tiers


def _catalog_max_requests(spec: dict[str, Any]) -> int | None:
    """The pool's per-batch request cap; None for a spec the models reject (not served)."""
    try:
        return max_requests(BatchPoolSpec.model_validate(spec))
    except PydanticValidationError as exc:
        log.warning("pool spec not understood, left out of /v1/models: %s", exc)
        return None
