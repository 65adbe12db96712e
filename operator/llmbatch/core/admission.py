"""Admission of a new batch: which pool serves it, its size caps, and the queue quotas.

Pure checks returning a :class:`Refusal` (or None); the gateway maps a refusal to 400 / 429, the
operator to a failed batch. Credit (402) is ``core.billing``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from llmbatch.api.resources import BatchPoolSpec, Tier
from llmbatch.core.tenancy import Tenant, pool_serves
from llmbatch.core.validation.media import MediaRules

CATALOG_MAX_REQUESTS = 1000
"""Requests per batch on a catalog (Tokens) pool unless the pool says otherwise (seed 000)."""
PRIVATE_MAX_REQUESTS = 95
"""Requests per batch on a private (GPUTime) pool unless the pool says otherwise (seed 000)."""


@dataclass(frozen=True)
class Refusal:
    """Why a batch is not admitted: ``too_large`` or ``not_allowed`` (400), ``over_quota``
    (429)."""

    kind: Literal["too_large", "not_allowed", "over_quota"]
    code: str
    message: str
    param: str | None = None


def max_requests(pool: BatchPoolSpec) -> int:
    """Most requests one batch may hold on ``pool``."""
    if pool.limits.max_requests is not None:
        return pool.limits.max_requests
    return PRIVATE_MAX_REQUESTS if pool.billing.mode == "GPUTime" else CATALOG_MAX_REQUESTS


def output_limit_required(pool: BatchPoolSpec) -> bool:
    """Whether every row for ``pool`` must bound its output tokens: unless the pool's
    ``limits.requireOutputTokenLimit`` is false (it is true by default)."""
    return pool.limits.require_output_token_limit


def default_output_limit(pool: BatchPoolSpec) -> int | None:
    """The output-token limit a row that sets none runs with on ``pool``: a Tokens (catalog)
    pool bills output tokens, so one that accepts such rows bounds them at
    ``billing.defaultOutputTokens`` — the figure its credit estimate reserved for them. None on a
    GPUTime pool (it bills time, and the engine's own bound applies) and on a pool that refuses
    such rows."""
    if pool.billing.mode != "Tokens" or output_limit_required(pool):
        return None
    return pool.billing.default_output_tokens


def media_rules(pool: BatchPoolSpec, model: str | None, remote_media: bool) -> MediaRules:
    """The image and audio parts ``model``'s rows may hold on ``pool``: its declared input
    modalities (a model the pool does not serve: not checked, its batch fails validation with
    model_not_found anyway), the pool's caps on image pixels and images per request, and remote
    URLs only where the platform lets the executors fetch them."""
    served = next((m for m in pool.models if m.name == model), None)
    modalities = frozenset(served.input_modalities) if served is not None else None
    return MediaRules(
        modalities=modalities,
        remote=remote_media,
        max_image_pixels=pool.limits.max_image_pixels,
        max_images=pool.limits.max_images_per_request,
    )


def choose_pool(
    pools: Iterable[dict[str, Any]],
    model: str | None,
    wanted: str | None = None,
    tenant: Tenant | None = None,
) -> dict[str, Any] | None:
    """The first pool (in API order, as the operator picks) serving ``model`` (to ``tenant``
    when given: a pool whose ``tenants`` leave it out is skipped)."""
    if not model:
        return None
    for pool in pools:
        if wanted and (pool.get("metadata") or {}).get("name") != wanted:
            continue
        if tenant is not None and not pool_serves(pool, tenant):
            continue
        names = [m.get("name") for m in (pool.get("spec") or {}).get("models") or []]
        if model in names:
            return pool
    return None


def check_batch_size(
    pool_name: str, pool: BatchPoolSpec, requests: int, input_bytes: int, param: str
) -> Refusal | None:
    """The pool's per-batch caps: request count and input size."""
    most = max_requests(pool)
    if requests > most:
        return Refusal(
            "too_large",
            "too_many_requests",
            f"The batch has {requests} requests; pool {pool_name} accepts at most {most} per "
            "batch. Split it into smaller batches.",
            param,
        )
    if input_bytes > pool.limits.max_bytes:
        return Refusal(
            "too_large",
            "file_too_large",
            f"The input is {input_bytes} bytes; pool {pool_name} accepts at most "
            f"{pool.limits.max_bytes} bytes per batch.",
            param,
        )
    return None


def check_tier(pool_name: str, pool: BatchPoolSpec, tier: Tier) -> Refusal | None:
    """The pool's ``expeditedAllowed``: an expedited batch on a pool that refuses the tier."""
    if tier == "expedited" and not pool.expedited_allowed:
        return Refusal(
            "not_allowed",
            "expedited_not_allowed",
            f"Pool {pool_name} does not accept expedited batches; use priority 'standard'.",
            "priority",
        )
    return None


def check_tenant_queue(
    *,
    queued_requests: int,
    queued_tokens: int,
    requests: int,
    tokens: int,
    max_queued_requests: int | None,
    max_queued_tokens: int | None,
) -> Refusal | None:
    """The tenant's limits on requests and estimated tokens in unfinished batches."""
    if max_queued_requests is not None and queued_requests + requests > max_queued_requests:
        return Refusal(
            "over_quota",
            "queue_full",
            f"Enqueued request limit reached: {queued_requests} requests are queued and this "
            f"batch adds {requests}; the limit for your organization is {max_queued_requests}. "
            "Retry after some batches complete.",
        )
    if max_queued_tokens is not None and queued_tokens + tokens > max_queued_tokens:
        return Refusal(
            "over_quota",
            "token_limit_exceeded",
            f"Enqueued token limit reached: {queued_tokens} estimated tokens are queued and this "
            f"batch adds {tokens}; the limit for your organization is {max_queued_tokens} "
            "enqueued tokens. Retry after some batches complete.",
        )
    return None


def check_pool_queue(
    pool_name: str, pool: BatchPoolSpec, pool_status: dict[str, Any], requests: int
) -> Refusal | None:
    """The pool's ``limits.maxQueuedRequests`` against its backlog plus this batch."""
    limit = pool.limits.max_queued_requests
    queued = sum(int(v or 0) for v in (pool_status.get("queueDepth") or {}).values())
    if limit is not None and queued + requests > limit:
        return Refusal(
            "over_quota",
            "capacity_exceeded",
            f"Pool {pool_name} is at capacity: {queued} requests are queued and this batch's "
            f"{requests} would pass its queue limit of {limit}. Retry later.",
        )
    return None
