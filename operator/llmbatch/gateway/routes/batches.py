"""``/v1/batches``: create (checked, admitted, idempotent), list, retrieve, cancel."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from llmbatch.api.openai import TERMINAL_STATUSES, Batch, ListPage
from llmbatch.api.resources import InlineInputRef
from llmbatch.core import keys
from llmbatch.core.admission import Refusal, check_pool_queue, choose_pool
from llmbatch.core.billing import BatchSize, Estimate
from llmbatch.core.ids import batch_id_from_name, batch_object_name
from llmbatch.core.inline import inline_file
from llmbatch.core.quotas import TenantCaps, check_waiting_batches, waiting
from llmbatch.gateway import metrics
from llmbatch.gateway.admission import (
    has_tenant_quota,
    plan_admission,
    pool_media_rules,
    pool_requires_output_limit,
    refusal_error,
    reservation,
    tenant_quota_refusal,
    unserved_model_error,
)
from llmbatch.gateway.bodylimit import CappedBodyRoute
from llmbatch.gateway.creation import (
    BatchRequest,
    CreateBatchRequest,
    batch_manifest,
    batch_name,
    check_input_file,
    check_replay,
    check_tenant,
    parse_create_request,
)
from llmbatch.gateway.credits import release_credit, reserve_credit
from llmbatch.gateway.deps import GW, Gateway, Reader, Writer
from llmbatch.gateway.errors import APIError, not_found
from llmbatch.gateway.inlinecheck import inline_media_error, unbounded_inline_error
from llmbatch.gateway.kube import QUOTA_EXCEEDED, Conflict
from llmbatch.gateway.mapping import (
    ANNOTATION_CANCEL_AT,
    BATCH_ID,
    CursorNotFound,
    batch_sort_key,
    batch_to_openai,
    list_envelope,
    paginate,
)
from llmbatch.gateway.responses import ERROR_RESPONSES, json_data, json_response
from llmbatch.gateway.tenants import caller_tenant

router = APIRouter(responses=ERROR_RESPONSES, route_class=CappedBodyRoute)
T = TypeVar("T")


@dataclass(frozen=True)
class Admitted:
    """What admission settled: the estimate and whether this request reserved credit for it."""

    estimate: Estimate
    reserved: bool = False


@router.post("/batches", response_model=Batch)
async def create_batch(
    body: CreateBatchRequest,
    who: Writer,
    gw: GW,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=512)] = None,
) -> Response:
    """Create a batch from an uploaded file or inline requests (exactly one)."""
    request = parse_create_request(body)
    name, label = batch_name(who.namespace, idempotency_key)
    if label:  # a replay answers before any check that depends on the current state
        existing = await gw.kube.get("batches", who.namespace, name)
        if existing is not None:
            return json_response(batch_to_openai(check_replay(existing, request.fingerprint)))
    size, model = await _input_size(gw, who.namespace, request)
    annotations = check_tenant(
        who.namespace, await gw.kube.namespace_annotations(who.namespace), request.spec.priority
    )
    admitted = await _admit(gw, who.namespace, annotations, name, request, size, model)
    request = await _stage_inline(gw, who.namespace, name, request)
    manifest = batch_manifest(
        name,
        who.namespace,
        request,
        requests=size.requests,
        estimated_tokens=admitted.estimate.tokens,
        idempotency_label=label,
        now_ns=time.time_ns(),
        credit_reserved=admitted.reserved,
    )
    return json_response(batch_to_openai(await _create(gw, manifest, admitted, request, label)))


async def _stage_inline(
    gw: Gateway, namespace: str, name: str, request: BatchRequest
) -> BatchRequest:
    """Inline requests go to the store, as an upload would, and the Batch refers to them
    (``spec.inlineInput``): a Batch stays a few KB whatever it carries. Written before the
    Batch is created; one whose create then fails is removed by retention."""
    requests = request.spec.requests
    if requests is None:
        return request
    stored = inline_file(requests)
    key = keys.inline_staging_key(namespace, batch_id_from_name(name))
    await asyncio.to_thread(gw.store.put, key, stored.data, sha256=stored.sha256)
    ref = InlineInputRef(
        key=key, requests=stored.requests, bytes=len(stored.data), sha256=stored.sha256
    )
    spec = request.spec.model_copy(update={"requests": None, "inline_input": ref})
    return dataclasses.replace(request, spec=spec)


async def _input_size(
    gw: Gateway, namespace: str, request: BatchRequest
) -> tuple[BatchSize, str | None]:
    """The input's size and model: measured inline, or as the upload recorded on the file."""
    if request.inline is not None:
        return request.inline.size, request.inline.model
    file_id = str(request.spec.input_file_id)
    obj = await gw.reads.get("batchfiles", namespace, file_id)
    return check_input_file(file_id, obj, request.spec.endpoint)


async def _admit(
    gw: Gateway,
    namespace: str,
    annotations: dict[str, str],
    name: str,
    request: BatchRequest,
    size: BatchSize,
    model: str | None,
) -> Admitted:
    """A model no pool serves to the tenant (404), per-batch caps and the pool's tier switch
    (400), the tenant's queue limits and its cap on unfinished batches, the pool's queue limit
    (429), then the credit (402).

    The pool is the one the operator will choose for the model; when the model is not known at
    creation (too long a name to record on the file: validation settles it) only the tenant's
    limits apply.
    """
    pools = await gw.kube.list_pools()
    tenant = await caller_tenant(gw, namespace, pools)
    unserved = unserved_model_error(pools, model, tenant, _model_param(request))
    if unserved is not None:
        metrics.BATCHES_REFUSED.labels("model_not_found").inc()
        raise unserved
    pool_obj = choose_pool(pools, model, tenant=tenant)
    if request.inline is not None and pool_requires_output_limit(pool_obj):
        unbounded = unbounded_inline_error(request.inline, request.spec.endpoint)
        if unbounded is not None:  # seed 000: the pool bills output tokens, rows must bound them
            raise unbounded
    if request.inline is not None and not request.inline.size.media.empty:
        # the parts were tallied at parse time: requests without any are not walked again
        rules = pool_media_rules(pool_obj, model, gw.settings.remote_media)
        media_refused = inline_media_error(request.spec, rules)
        if media_refused is not None:
            metrics.BATCHES_REFUSED.labels(media_refused.code or "invalid_media").inc()
            raise media_refused
    plan = _admitted(plan_admission(pool_obj, request.spec.priority, size, request.input_param))
    if has_tenant_quota(annotations):
        batches = await gw.kube.list_objects("batches", namespace)
        _admitted(tenant_quota_refusal(annotations, batches, size, plan.estimate))
    caps = TenantCaps.of(annotations, gw.settings.tenant_caps)
    if caps.waiting_batches is not None:
        waiting_now = await _waiting_batches(gw, namespace)
        _admitted(check_waiting_batches(waiting_now, caps.waiting_batches))
    if plan.pool is None:
        return Admitted(plan.estimate)
    _admitted(check_pool_queue(plan.name, plan.pool, plan.status or {}, size.requests))
    try:
        reserved = await reserve_credit(
            gw.kube, namespace, reservation(name, plan, int(time.time()))
        )
    except APIError as exc:
        metrics.BATCHES_REFUSED.labels(exc.code or str(exc.status)).inc()
        raise
    return Admitted(plan.estimate, reserved)


async def _waiting_batches(gw: Gateway, namespace: str) -> int:
    """The tenant's batches not finished: from the listing cache once it is synced (O(1)),
    before that from a listing."""
    if gw.lists.batches.synced:
        return gw.lists.batches.index.total(namespace)
    return sum(1 for b in await gw.kube.list_objects("batches", namespace) if waiting(b))


def _model_param(request: BatchRequest) -> str:
    """Where the model was named: the first inline request's body, else the file's lines."""
    return "requests[0].body.model" if request.inline is not None else "input_file_id"


def _admitted(outcome: T | Refusal) -> T:
    """``outcome`` unless admission refused: then the counted 400 or 429."""
    if isinstance(outcome, Refusal):
        metrics.BATCHES_REFUSED.labels(outcome.code).inc()
        raise refusal_error(outcome)
    return outcome


async def _create(
    gw: Gateway, manifest: dict[str, Any], admitted: Admitted, request: BatchRequest, label: str
) -> dict[str, Any]:
    """Create the Batch; a lost race for an Idempotency-Key name answers with the winner's.

    The reservation is keyed by the name, so it is the hold of whichever Batch gets the name.
    It is given back only when no Batch has it; any other failure (a timeout, say) may have
    created the Batch server-side, and the operator's upkeep drops a reservation whose Batch
    never appeared after 5 minutes.

    Without a key the name is random (96 bits): only this request's own create, tried again
    after the API server answered 503 (``KubeClient.create_custom``), can have taken it.
    """
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    try:
        created = await gw.kube.create("batches", namespace, manifest)
    except APIError as exc:
        if exc.code == QUOTA_EXCEEDED:  # a ResourceQuota refused it: nothing was created
            metrics.BATCHES_REFUSED.labels(exc.code).inc()
            if admitted.reserved:
                await release_credit(gw.kube, namespace, name)
        raise
    except Conflict as exc:  # a concurrent create with the same Idempotency-Key won, or ours
        existing = await gw.kube.get("batches", namespace, name)
        if existing is None and admitted.reserved:
            await release_credit(gw.kube, namespace, name)
        if existing is None:
            raise APIError(
                409, "The batch is being created concurrently; retry.", code="conflict"
            ) from exc
        if label:
            if admitted.reserved:  # this request's reservation holds the winner's batch
                metrics.CREDITS_RESERVED.inc(float(admitted.estimate.amount))
            return check_replay(existing, request.fingerprint)
        created = existing  # no key: this request's earlier try was stored after all
    gw.reads.put("batches", namespace, name, created)
    gw.lists.batches.put(created)  # listed at once: a client lists what it just created
    metrics.BATCHES_CREATED.inc()
    if admitted.reserved:
        metrics.CREDITS_RESERVED.inc(float(admitted.estimate.amount))
    return created


async def _get_batch(gw: Gateway, namespace: str, batch_id: str) -> dict[str, Any]:
    if not BATCH_ID.match(batch_id):
        raise not_found("batch", batch_id, "batch_id")
    obj = await gw.reads.get("batches", namespace, batch_object_name(batch_id))
    if obj is None:  # finished long ago: retention moved it to the archive
        obj = await gw.archive.get(namespace, batch_id)
    if obj is None:
        raise not_found("batch", batch_id, "batch_id")
    return obj


def _openai_name(obj: dict[str, Any]) -> bool:
    return str((obj.get("metadata") or {}).get("name", "")).startswith("batch-")


def _batch_id(obj: dict[str, Any]) -> str:
    return batch_id_from_name(obj["metadata"]["name"])


@router.get("/batches", response_model=ListPage[Batch])
async def list_batches(
    who: Reader,
    gw: GW,
    after: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    """The tenant's batches, newest first: from the listing cache once it is synced (with the
    tenant's archived batches in it: read first if the archive's load has not reached them)."""
    try:
        if gw.lists.batches.synced:
            await gw.lists.ensure_archived(who.namespace)
            page, more = gw.lists.batches.index.page_after(who.namespace, after, limit)
        else:
            page, more = await _listed_by_the_api(gw, who.namespace, after, limit)
    except CursorNotFound as exc:
        raise APIError(400, f"No such batch to list after: {after!r}.", param="after") from exc
    return json_data(list_envelope(page, more))


async def _listed_by_the_api(
    gw: Gateway, namespace: str, after: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool]:
    """A page from a listing of the tenant's batches (the way before the cache, for its start)."""
    items = [b for b in await gw.kube.list_objects("batches", namespace) if _openai_name(b)]
    items.sort(key=batch_sort_key, reverse=True)
    page, more = paginate(items, _batch_id, after, limit)
    return [batch_to_openai(b).model_dump(mode="json") for b in page], more


@router.get("/batches/{batch_id}", response_model=Batch)
async def retrieve_batch(batch_id: str, who: Reader, gw: GW) -> Response:
    return json_response(batch_to_openai(await _get_batch(gw, who.namespace, batch_id)))


@router.post("/batches/{batch_id}/cancel", response_model=Batch)
async def cancel_batch(batch_id: str, who: Writer, gw: GW) -> Response:
    """Ask the operator to cancel: ``spec.cancel = true``; answers ``cancelling`` at once."""
    obj = await _get_batch(gw, who.namespace, batch_id)
    status = (obj.get("status") or {}).get("status")
    if status in TERMINAL_STATUSES:
        raise APIError(
            409,
            f"Cannot cancel a batch with status '{status}'.",
            param="batch_id",
            code="batch_not_cancellable",
        )
    if (obj.get("spec") or {}).get("cancel") or status == "cancelling":
        return json_response(batch_to_openai(obj))
    name = obj["metadata"]["name"]
    patch = {
        "metadata": {"annotations": {ANNOTATION_CANCEL_AT: str(int(time.time()))}},
        "spec": {"cancel": True},
    }
    patched = await gw.kube.patch("batches", who.namespace, name, patch)
    gw.reads.put("batches", who.namespace, name, patched)
    gw.lists.batches.put(patched)
    if patched is None:
        raise not_found("batch", batch_id, "batch_id")
    return json_response(batch_to_openai(patched))
