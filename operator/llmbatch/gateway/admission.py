"""Admission of a new batch, without I/O: the pool's per-batch caps and price, the tenant's queue
quotas, the credit hold. ``llmbatch.gateway.routes.batches`` reads pools, batches and the
account around these decisions; the rules themselves are ``llmbatch.core.admission``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

from llmbatch.api.openai import TERMINAL_STATUSES
from llmbatch.api.resources import BatchPoolSpec, CreditReservation, PoolBilling, Pricing, Tier
from llmbatch.core.admission import (
    Refusal,
    check_batch_size,
    check_tenant_queue,
    check_tier,
    choose_pool,
    media_rules,
)
from llmbatch.core.admission import output_limit_required as pool_output_limit_required
from llmbatch.core.billing import (
    BatchSize,
    Estimate,
    estimate_batch,
    estimate_input_tokens,
    estimate_output_tokens,
    new_reservation,
)
from llmbatch.core.tenancy import Tenant
from llmbatch.core.validation import MediaRules, ValidationLimits
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.mapping import ANNOTATION_ESTIMATED_TOKENS, ANNOTATION_REQUESTS

NAMESPACE_MAX_QUEUED = "llmbatch.io/max-queued-requests"
NAMESPACE_MAX_QUEUED_TOKENS = "llmbatch.io/max-queued-tokens"


@dataclass(frozen=True)
class PoolPlan:
    """The pool the operator will pick for the batch, and what the batch costs on it."""

    estimate: Estimate
    name: str = ""
    pool: BatchPoolSpec | None = None
    """None: the model was not known at creation (validation settles it); only tenant limits."""
    status: dict[str, Any] | None = None
    pricing: Pricing | None = None


def output_limit_required(
    pools: list[dict[str, Any]], model: str | None, tenant: Tenant | None = None
) -> bool:
    """Whether every row of an upload for ``model`` must bound its output tokens:
    :func:`pool_requires_output_limit` of the pool the operator will pick."""
    return pool_requires_output_limit(choose_pool(pools, model, tenant=tenant))


def pool_requires_output_limit(pool_obj: dict[str, Any] | None) -> bool:
    """Whether rows for the pool must bound their output tokens (``core.admission``: unless its
    ``limits.requireOutputTokenLimit`` is false). No pool (a model none serves) keeps the
    default (its batch fails validation anyway)."""
    if pool_obj is None:
        return True
    return pool_output_limit_required(BatchPoolSpec.model_validate(pool_obj.get("spec") or {}))


def pool_media_rules(
    pool_obj: dict[str, Any] | None, model: str | None, remote_media: bool
) -> MediaRules:
    """The media rules of ``pool_obj``, the pool the operator will pick for ``model``
    (``core.admission``); no pool (a model none serves): only the platform's egress (its batch
    fails anyway)."""
    if pool_obj is None:
        return MediaRules(remote=remote_media)
    spec = BatchPoolSpec.model_validate(pool_obj.get("spec") or {})
    return media_rules(spec, model, remote_media)


def upload_limits(
    base: ValidationLimits,
    pools: list[dict[str, Any]],
    model: str | None,
    tenant: Tenant | None,
    remote_media: bool,
) -> ValidationLimits:
    """The limits an upload's rows are checked against, settled by its first line's model:
    the output-token rule and the media rules of the pool that will serve it."""
    pool_obj = choose_pool(pools, model, tenant=tenant)
    return replace(
        base,
        require_output_token_limit=pool_requires_output_limit(pool_obj),
        media=pool_media_rules(pool_obj, model, remote_media),
    )


def unserved_model_error(
    pools: list[dict[str, Any]], model: str | None, tenant: Tenant, param: str
) -> APIError | None:
    """400 ``model_not_found`` (the wire contract's "unknown model" is a 400) for a model no
    pool serves to ``tenant``: none serves it at all,
    or only pools of other tenants do (a private deployment) — one answer for both, so another
    tenant's model names stay as unknown as names nobody serves. None when the model is
    unknown here (not recorded on the file): validation then settles it."""
    if not model or choose_pool(pools, model, tenant=tenant) is not None:
        return None
    shown = model if len(model) <= 128 else model[:128] + "..."
    return APIError(
        400,
        f"The model '{shown}' does not exist or you do not have access to it.",
        type="invalid_request_error",
        param=param,
        code="model_not_found",
    )


def plan_admission(
    pool_obj: dict[str, Any] | None, tier: Tier, size: BatchSize, param: str
) -> PoolPlan | Refusal:
    """The estimate on the chosen pool, or the refusal of its tier switch or per-batch caps."""
    if pool_obj is None:
        output = estimate_output_tokens(size, PoolBilling().default_output_tokens)
        tokens = estimate_input_tokens(size.input_bytes, size.media)
        return PoolPlan(Estimate(tokens, output, Decimal(0)))
    name = str(pool_obj["metadata"]["name"])
    pool = BatchPoolSpec.model_validate(pool_obj.get("spec") or {})
    status = pool_obj.get("status") or {}
    pricing = getattr(pool.tiers, tier).pricing
    refusal = check_tier(name, pool, tier) or check_batch_size(
        name, pool, size.requests, size.input_bytes, param
    )
    if refusal is not None:
        return refusal
    estimate = estimate_batch(pool, pricing, size, status.get("throughputPerSlot"))
    return PoolPlan(estimate, name, pool, status, pricing)


def tenant_quota_refusal(
    annotations: dict[str, str],
    batches: list[dict[str, Any]],
    size: BatchSize,
    estimate: Estimate,
) -> Refusal | None:
    """The tenant's soft queue quotas (namespace annotations) against its unfinished batches."""
    return check_tenant_queue(
        queued_requests=sum(_queued_requests(b) for b in batches),
        queued_tokens=sum(_queued_tokens(b) for b in batches),
        requests=size.requests,
        tokens=estimate.tokens,
        max_queued_requests=_int_annotation(annotations, NAMESPACE_MAX_QUEUED),
        max_queued_tokens=_int_annotation(annotations, NAMESPACE_MAX_QUEUED_TOKENS),
    )


def has_tenant_quota(annotations: dict[str, str]) -> bool:
    return any(
        _int_annotation(annotations, key) is not None
        for key in (NAMESPACE_MAX_QUEUED, NAMESPACE_MAX_QUEUED_TOKENS)
    )


def _int_annotation(annotations: dict[str, str], key: str) -> int | None:
    raw = annotations.get(key, "").strip()
    return int(raw) if raw.isdigit() else None


def _queued_requests(batch: dict[str, Any]) -> int:
    status = batch.get("status") or {}
    if status.get("status") in TERMINAL_STATUSES:
        return 0
    total = (status.get("requestCounts") or {}).get("total") or 0
    if not total:
        raw = ((batch.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_REQUESTS, "")
        spec = batch.get("spec") or {}
        staged = (spec.get("inlineInput") or {}).get("requests")
        inline = staged if isinstance(staged, int) else len(spec.get("requests") or [])
        total = int(raw) if raw.isdigit() else inline
    return int(total)


def _queued_tokens(batch: dict[str, Any]) -> int:
    """Estimated tokens of an unfinished batch (the operator's figure, else the gateway's)."""
    status = batch.get("status") or {}
    if status.get("status") in TERMINAL_STATUSES:
        return 0
    tokens = (status.get("billing") or {}).get("estimatedTokens")
    if isinstance(tokens, int) and tokens > 0:
        return tokens
    annotations = (batch.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_ESTIMATED_TOKENS, "")
    return int(raw) if raw.isdigit() else 0


def refusal_error(refusal: Refusal) -> APIError:
    """400 for a per-batch cap or a tier the pool refuses, else 429 with Retry-After."""
    if refusal.kind in ("too_large", "not_allowed"):
        return APIError(400, refusal.message, param=refusal.param, code=refusal.code)
    return APIError(
        429,
        refusal.message,
        type="rate_limit_error",
        code=refusal.code,
        headers={"Retry-After": "60"},
    )


def reservation(name: str, plan: PoolPlan, now: int) -> CreditReservation:
    """The credit hold for batch ``name`` on the plan's pool (token price or GPU time)."""
    assert plan.pool is not None
    assert plan.pricing is not None
    return new_reservation(
        batch=name,
        pool_name=plan.name,
        pool=plan.pool,
        pricing=plan.pricing,
        estimate=plan.estimate,
        created_at=now,
    )
