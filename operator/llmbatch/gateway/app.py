"""The gateway's FastAPI app: OpenAI Files / Batches / Models onto BatchFile / Batch / BatchPool.

Stateless: every fact lives in Kubernetes objects (tenant namespace = the key's ``namespace``) or
in the object store. ``create_app()`` builds the app; ``llmbatch gateway`` serves it with uvicorn.
Routes are served under both ``/v1`` and ``/openai/v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from llmbatch.api.openai import (
    TERMINAL_STATUSES,
    Batch,
    ErrorEnvelope,
    FileDeleted,
    FileObject,
    ListPage,
)
from llmbatch.api.resources import (
    API_VERSION,
    BatchPoolSpec,
    BatchSpec,
    CreditReservation,
    PoolBilling,
    Pricing,
)
from llmbatch.core import keys
from llmbatch.core.admission import (
    Refusal,
    check_batch_size,
    check_pool_queue,
    check_tenant_queue,
    choose_pool,
    max_requests,
)
from llmbatch.core.billing import (
    BatchSize,
    Estimate,
    estimate_batch,
    estimate_input_tokens,
    estimate_output_tokens,
    money,
)
from llmbatch.core.ids import batch_id_from_name, batch_object_name
from llmbatch.core.validation import (
    InvalidLine,
    ValidationLimits,
    check_request,
    normalize_endpoint,
)
from llmbatch.gateway import metrics
from llmbatch.gateway.auth import KeyRing, KeyWatcher, Principal
from llmbatch.gateway.bodylimit import CappedBodyRoute
from llmbatch.gateway.credits import release_credit, reserve_credit
from llmbatch.gateway.errors import APIError, install_handlers, not_found, unauthorized
from llmbatch.gateway.kube import Conflict, GatewayKube, KubeAPI
from llmbatch.gateway.mapping import (
    ANNOTATION_CANCEL_AT,
    ANNOTATION_CREATED_NS,
    ANNOTATION_ENDPOINT,
    ANNOTATION_ESTIMATED_TOKENS,
    ANNOTATION_IDEMPOTENCY_INPUT,
    ANNOTATION_REQUESTS,
    LABEL_IDEMPOTENCY,
    CursorNotFound,
    batch_sort_key,
    batch_to_openai,
    file_sort_key,
    file_to_openai,
    k8s_time,
    list_page,
    paginate,
)
from llmbatch.gateway.readcache import ReadCache
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.gateway.upload import MultipartUpload, bad_line_error
from llmbatch.storage import ObjectNotFound, ObjectStore, StoreError, open_store

log = logging.getLogger(__name__)

NAMESPACE_EXPEDITED_DISABLED = "llmbatch.io/expedited-disabled"
NAMESPACE_MAX_QUEUED = "llmbatch.io/max-queued-requests"
NAMESPACE_MAX_QUEUED_TOKENS = "llmbatch.io/max-queued-tokens"
FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")
BATCH_ID = re.compile(r"^batch_[a-z0-9]([-a-z0-9.]{0,240}[a-z0-9])?$")
MAX_INLINE_REQUESTS = 1000
MAX_RECORDED_MODEL = 256
"""Longest model name a BatchFile records (``spec.model`` is ShortText, as pools' names are)."""


# --- state and dependencies --------------------------------------------------------------------


@dataclass
class Gateway:
    """Everything a request handler needs."""

    settings: GatewaySettings
    kube: KubeAPI
    store: ObjectStore
    keyring: KeyRing
    reads: ReadCache


def _state(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def gateway_of(request: Request) -> Gateway:
    """The dependency (async: a sync dependency would cost a thread-pool hop per request)."""
    return _state(request)


_bearer = HTTPBearer(
    auto_error=False, description="An API key: `Authorization: Bearer sk-llmb-...`"
)


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    gw = _state(request)
    if credentials is None or not credentials.credentials:
        metrics.AUTH_FAILURES.labels("missing").inc()
        raise unauthorized(
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    principal = gw.keyring.authenticate(credentials.credentials)
    if principal is None:
        metrics.AUTH_FAILURES.labels("invalid").inc()
        shown = credentials.credentials[:8] + "****" if len(credentials.credentials) > 12 else ""
        raise unauthorized(f"Incorrect API key provided: {shown or '****'}.")
    return principal


async def reader(who: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not who.can_read():
        metrics.AUTH_FAILURES.labels("scope").inc()
        raise _missing_scope("inference:read")
    return who


async def writer(who: Annotated[Principal, Depends(authenticate)]) -> Principal:
    if not who.can_write():
        metrics.AUTH_FAILURES.labels("scope").inc()
        raise _missing_scope("inference:write")
    return who


def _missing_scope(scope: str) -> APIError:
    return APIError(
        403,
        f"You have insufficient permissions for this operation. Missing scopes: {scope}.",
        type="permission_error",
        code="insufficient_scope",
    )


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
GW = Annotated[Gateway, Depends(gateway_of)]


def _json(model: BaseModel, status: int = 200) -> Response:
    return Response(
        orjson.dumps(model.model_dump(mode="json")),
        status_code=status,
        media_type="application/json",
    )


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorEnvelope, "description": text}
    for code, text in (
        (400, "Invalid request"),
        (401, "Missing or bad API key"),
        (403, "Key lacks the scope"),
        (404, "Unknown id"),
        (409, "Conflict"),
        (402, "Not enough credit"),
        (413, "File or request body too large"),
        (429, "Queue full"),
    )
}

router = APIRouter(responses=_ERRORS)
capped_router = APIRouter(responses=_ERRORS, route_class=CappedBodyRoute)


# --- files -------------------------------------------------------------------------------------

_UPLOAD_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "purpose": {"type": "string", "enum": ["batch"]},
                    },
                }
            }
        },
    }
}


@router.post("/files", response_model=FileObject, openapi_extra=_UPLOAD_SCHEMA)
async def create_file(request: Request, who: Writer, gw: GW) -> Response:
    """Upload a batch input file (multipart ``file``, ``purpose=batch``), checked as it streams."""
    file_id = keys.new_file_id()
    key = keys.file_key(who.namespace, file_id)
    upload = MultipartUpload(request, gw.store, key, gw.settings.max_upload_bytes)
    try:
        stored = await upload.run()
    except APIError as exc:
        metrics.UPLOADS_REJECTED.labels(exc.code or str(exc.status)).inc()
        raise
    except StoreError as exc:
        log.warning("upload to the store failed: %s", exc)
        raise _store_unavailable() from exc
    if stored is None:
        raise APIError(400, "Missing required parameter: 'file'.", param="file", code="missing")
    try:
        if "purpose" not in upload.fields:
            raise APIError(
                400, "Missing required parameter: 'purpose'.", param="purpose", code="missing"
            )
        now_ns = time.time_ns()
        created = now_ns // 1_000_000_000
        body: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": "BatchFile",
            "metadata": {
                "name": file_id,
                "namespace": who.namespace,
                "annotations": {
                    ANNOTATION_CREATED_NS: str(now_ns),
                    ANNOTATION_ENDPOINT: stored.endpoint,
                },
            },
            "spec": {
                "id": file_id,
                "bytes": stored.info.size,
                "filename": upload.filename or "upload.jsonl",
                "purpose": "batch",
                "sha256": stored.info.sha256,
                "lineCount": stored.result.request_count,
                "outputTokenLimits": stored.result.declared_output_tokens,
                "requestsWithoutOutputLimit": stored.result.requests_without_output_limit,
                "storageKey": key,
                "createdAt": created,
                "expiresAt": created + 86400,
            },
        }
        # Longer than BatchFile.spec.model allows, it names no pool anyway: left off, the
        # batch is estimated as one without a pool and validation fails it (model_not_found).
        if stored.result.model and len(stored.result.model) <= MAX_RECORDED_MODEL:
            body["spec"]["model"] = stored.result.model
        obj = await gw.kube.create(
            "batchfiles", who.namespace, {k: v for k, v in body.items() if v is not None}
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(gw.store.delete, key)
        raise
    gw.reads.put("batchfiles", who.namespace, file_id, obj)
    metrics.UPLOAD_BYTES.inc(stored.info.size)
    return _json(file_to_openai(obj))


def _store_unavailable() -> APIError:
    return APIError(
        503,
        "The file store is temporarily unavailable; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
    )


async def _get_file(gw: Gateway, namespace: str, file_id: str) -> dict[str, Any]:
    if not FILE_ID.match(file_id):
        raise not_found("File object", file_id, "file_id")
    obj = await gw.reads.get("batchfiles", namespace, file_id)
    if obj is None:
        raise not_found("File object", file_id, "file_id")
    return obj


@router.get("/files", response_model=ListPage[FileObject])
async def list_files(
    who: Reader,
    gw: GW,
    after: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    order: Literal["asc", "desc"] = "desc",
    purpose: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """The tenant's files, newest first (``order=asc`` for oldest first)."""
    items = await gw.kube.list_objects("batchfiles", who.namespace)
    if purpose:
        items = [i for i in items if (i.get("spec") or {}).get("purpose") == purpose]
    items.sort(key=file_sort_key, reverse=order == "desc")
    files = [file_to_openai(i) for i in items]
    try:
        page, more = paginate(files, lambda f: f.id, after, limit)
    except CursorNotFound as exc:
        raise APIError(400, f"No such file to list after: {after!r}.", param="after") from exc
    return _json(list_page(page, more, lambda f: f.id))


@router.get("/files/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, who: Reader, gw: GW) -> Response:
    return _json(file_to_openai(await _get_file(gw, who.namespace, file_id)))


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def file_content(file_id: str, who: Reader, gw: GW) -> StreamingResponse:
    """The file's bytes, streamed from the store."""
    obj = await _get_file(gw, who.namespace, file_id)
    key = keys.owned_file_key(who.namespace, file_id, (obj.get("spec") or {}).get("storageKey"))
    if key is None:
        raise not_found("File object", file_id, "file_id")
    try:
        chunks = await asyncio.to_thread(gw.store.iter_range, key)
    except ObjectNotFound as exc:
        raise not_found("File object", file_id, "file_id") from exc
    except (StoreError, ValueError) as exc:
        raise _store_unavailable() from exc

    def stream() -> Iterator[bytes]:
        try:
            yield from chunks
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    headers = {"Content-Disposition": f'attachment; filename="{file_id}.jsonl"'}
    return StreamingResponse(stream(), media_type="application/octet-stream", headers=headers)


@router.delete("/files/{file_id}", response_model=FileDeleted)
async def delete_file(file_id: str, who: Writer, gw: GW) -> Response:
    """Delete the bytes and the BatchFile (allowed for inputs in use, as OpenAI does)."""
    obj = await _get_file(gw, who.namespace, file_id)
    key = keys.owned_file_key(who.namespace, file_id, (obj.get("spec") or {}).get("storageKey"))
    try:
        if key is not None:  # a foreign storageKey: drop the object, never those bytes
            await asyncio.to_thread(gw.store.delete, key)
    except (StoreError, ValueError) as exc:
        raise _store_unavailable() from exc
    deleted = await gw.kube.delete("batchfiles", who.namespace, file_id)
    gw.reads.put("batchfiles", who.namespace, file_id, None)
    if not deleted:
        raise not_found("File object", file_id, "file_id")
    return _json(FileDeleted(id=file_id))


# --- batches -----------------------------------------------------------------------------------


class InlineRequestIn(BaseModel):
    """One inline request (the fields of an input line)."""

    model_config = ConfigDict(extra="allow")
    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: Any = None


class CreateBatchRequest(BaseModel):
    """``POST /v1/batches``."""

    model_config = ConfigDict(extra="allow")
    endpoint: str = Field(max_length=256)
    completion_window: str = Field(max_length=64)
    input_file_id: str | None = Field(default=None, max_length=256)
    requests: list[InlineRequestIn] | None = None
    metadata: dict[str, str] | None = None
    priority: str | None = Field(default=None, max_length=64)
    model: str | None = Field(default=None, max_length=256)
    output_expires_after: Any = None
    """``{"anchor": "created_at", "seconds": 3600..2592000}``: lifetime of the result files."""


OUTPUT_EXPIRY_RANGE = (3600, 2592000)


def _output_expiry_seconds(value: Any) -> int | None:
    """Seconds of ``output_expires_after`` (anchored at the result files' creation), checked."""
    if value is None:
        return None
    param = "output_expires_after"
    if not isinstance(value, dict):
        raise APIError(
            400,
            f"Invalid type for '{param}': expected an object with 'anchor' and 'seconds'.",
            param=param,
            code="invalid_type",
        )
    if value.get("anchor") != "created_at":
        raise APIError(
            400,
            f"Invalid value for '{param}.anchor': {str(value.get('anchor'))[:32]!r}. "
            "Supported values are: 'created_at'.",
            param=f"{param}.anchor",
            code="invalid_value",
        )
    seconds = value.get("seconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise APIError(
            400,
            f"Invalid type for '{param}.seconds': expected an integer.",
            param=f"{param}.seconds",
            code="invalid_type",
        )
    low, high = OUTPUT_EXPIRY_RANGE
    if not low <= seconds <= high:
        raise APIError(
            400,
            f"Invalid '{param}.seconds': expected a value between {low} and {high}, "
            f"but got {seconds} instead.",
            param=f"{param}.seconds",
            code="invalid_value",
        )
    return seconds


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > 16:
        raise APIError(
            400,
            f"Invalid 'metadata': too many properties. Expected at most 16, got {len(metadata)}.",
            param="metadata",
            code="invalid_value",
        )
    for key, value in metadata.items():
        if not key or len(key) > 64:
            raise APIError(
                400,
                f"Invalid 'metadata': key {key[:70]!r} must be 1 to 64 characters long.",
                param="metadata",
                code="invalid_value",
            )
        if len(value) > 512:
            raise APIError(
                400,
                f"Invalid 'metadata.{key}': string too long. Expected a string with maximum "
                f"length 512, but got a string with length {len(value)} instead.",
                param=f"metadata.{key}",
                code="string_above_max_length",
            )


def _check_inline(requests: list[InlineRequestIn], endpoint: str) -> list[dict[str, Any]]:
    if not requests:
        raise APIError(400, "'requests' must not be empty.", param="requests", code="empty_file")
    if len(requests) > MAX_INLINE_REQUESTS:
        raise APIError(
            400,
            f"At most {MAX_INLINE_REQUESTS} inline requests; upload a file for more.",
            param="requests",
            code="too_many_requests",
        )
    limits = ValidationLimits()
    seen: set[str] = set()
    model: str | None = None
    out: list[dict[str, Any]] = []
    for index, item in enumerate(requests):
        raw = item.model_dump()
        problems, line_model, _ = check_request(
            raw, endpoint=endpoint, limits=limits, line=index + 1
        )
        problem: InvalidLine | None = problems[0] if problems else None
        if problem is None and line_model is not None:
            if model is not None and line_model != model:
                problem = InvalidLine(
                    "mismatched_model",  # type: ignore[arg-type]
                    f"Every request must use one model: requests[{index}] uses {line_model!r}, "
                    f"earlier ones use {model!r}.",
                    index + 1,
                    "body.model",
                )
            model = model or line_model
        if problem is None and raw["custom_id"] in seen:
            problem = InvalidLine(
                "duplicate_custom_id",  # type: ignore[arg-type]
                f"custom_id {str(raw['custom_id'])[:64]!r} appears more than once.",
                index + 1,
                "custom_id",
            )
        if problem is not None:
            raise APIError(
                400,
                f"Invalid requests[{index}]: {problem.message}",
                param=f"requests[{index}]" + (f".{problem.param}" if problem.param else ""),
                code=str(problem.code),
            )
        seen.add(raw["custom_id"])
        out.append(
            {"customID": raw["custom_id"], "method": "POST", "url": endpoint, "body": raw["body"]}
        )
    return out


def _idempotency(namespace: str, key: str) -> tuple[str, str]:
    """``(object name, label value)`` of an idempotency key: one tenant's key → one batch."""
    digest = hashlib.sha256(f"{namespace}\0{key}".encode()).hexdigest()
    return "batch-" + digest[:24], digest[:63]


def _fingerprint(body: CreateBatchRequest, inline: list[dict[str, Any]] | None) -> str:
    if inline is None:
        return str(body.input_file_id)
    return (
        "inline-"
        + hashlib.sha256(orjson.dumps(inline, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]
    )


def _replay(existing: dict[str, Any], fingerprint: str) -> Response:
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_IDEMPOTENCY_INPUT) != fingerprint:
        raise APIError(
            409,
            "This Idempotency-Key was already used with a different input file; use a new key "
            "for a new batch.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return _json(batch_to_openai(existing))


def _queued_requests(batch: dict[str, Any]) -> int:
    status = batch.get("status") or {}
    if status.get("status") in TERMINAL_STATUSES:
        return 0
    counts = status.get("requestCounts") or {}
    total = counts.get("total") or 0
    if not total:
        raw = ((batch.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_REQUESTS, "")
        total = int(raw) if raw.isdigit() else len((batch.get("spec") or {}).get("requests") or [])
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


def _file_size(file_obj: dict[str, Any], requests: int) -> tuple[BatchSize, str | None]:
    """What the upload's validation recorded on the BatchFile (older files: every request
    assumed to have no output limit)."""
    spec = file_obj.get("spec") or {}
    declared = spec.get("outputTokenLimits")
    without = spec.get("requestsWithoutOutputLimit")
    size = BatchSize(
        input_bytes=int(spec.get("bytes") or 0),
        requests=requests,
        output_token_limits=int(declared or 0),
        requests_without_output_limit=int(requests if without is None else without),
    )
    return size, spec.get("model")


def _inline_size(inline: list[dict[str, Any]], endpoint: str) -> tuple[BatchSize, str | None]:
    """The same figures for inline requests, measured on the lines the operator will store."""
    input_bytes = declared = without = 0
    for item in inline:
        body = item["body"]
        input_bytes += 1 + len(
            orjson.dumps(
                {"custom_id": item["customID"], "method": "POST", "url": item["url"], "body": body}
            )
        )
        if endpoint == "/v1/embeddings":
            continue
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            declared += limit
        else:
            without += 1
    model = inline[0]["body"].get("model") if inline else None
    size = BatchSize(input_bytes, len(inline), declared, without)
    return size, model if isinstance(model, str) else None


def _int_annotation(annotations: dict[str, str], key: str) -> int | None:
    raw = annotations.get(key, "").strip()
    return int(raw) if raw.isdigit() else None


@dataclass
class Admitted:
    """What admission settled: the estimate and whether this request reserved credit for it."""

    estimate: Estimate
    reserved: bool = False


def _refused(refusal: Refusal) -> APIError:
    metrics.BATCHES_REFUSED.labels(refusal.code).inc()
    if refusal.kind == "too_large":
        return APIError(400, refusal.message, param=refusal.param, code=refusal.code)
    return APIError(
        429,
        refusal.message,
        type="rate_limit_error",
        code=refusal.code,
        headers={"Retry-After": "60"},
    )


async def _admit(
    gw: Gateway,
    namespace: str,
    annotations: dict[str, str],
    name: str,
    tier: str,
    size: BatchSize,
    model: str | None,
    param: str,
) -> Admitted:
    """Per-batch caps (400), tenant and pool queue limits (429), then the credit (402).

    The pool is the one the operator will choose for the model; without one (the model is not
    served: validation will fail the batch) only the tenant's limits apply.
    """
    pool_obj = choose_pool(await gw.kube.list_pools(), model)
    pool: BatchPoolSpec | None = None
    pool_name = ""
    if pool_obj is not None:
        pool_name = str(pool_obj["metadata"]["name"])
        pool = BatchPoolSpec.model_validate(pool_obj.get("spec") or {})
    pricing = Pricing()
    if pool is not None and pool_obj is not None:
        pricing = getattr(pool.tiers, tier).pricing
        throughput = (pool_obj.get("status") or {}).get("throughputPerSlot")
        estimate = estimate_batch(pool, pricing, size, throughput)
        refusal = check_batch_size(pool_name, pool, size.requests, size.input_bytes, param)
        if refusal is not None:
            raise _refused(refusal)
    else:
        estimate = Estimate(
            estimate_input_tokens(size.input_bytes),
            estimate_output_tokens(size, PoolBilling().default_output_tokens),
            Decimal(0),
        )

    queued_limit = _int_annotation(annotations, NAMESPACE_MAX_QUEUED)
    tokens_limit = _int_annotation(annotations, NAMESPACE_MAX_QUEUED_TOKENS)
    if queued_limit is not None or tokens_limit is not None:
        batches = await gw.kube.list_objects("batches", namespace)
        refusal = check_tenant_queue(
            queued_requests=sum(_queued_requests(b) for b in batches),
            queued_tokens=sum(_queued_tokens(b) for b in batches),
            requests=size.requests,
            tokens=estimate.tokens,
            max_queued_requests=queued_limit,
            max_queued_tokens=tokens_limit,
        )
        if refusal is not None:
            raise _refused(refusal)
    if pool is None or pool_obj is None:
        return Admitted(estimate)
    refusal = check_pool_queue(pool_name, pool, pool_obj.get("status") or {}, size.requests)
    if refusal is not None:
        raise _refused(refusal)

    gpu_mode = pool.billing.mode == "GPUTime"
    entry = CreditReservation(
        batch=name,
        amount=money(estimate.amount),
        estimated_tokens=estimate.tokens,
        pool=pool_name,
        mode=pool.billing.mode,
        pricing=None if gpu_mode else pricing,
        gpu_hour_price=pool.billing.gpu_hour_price if gpu_mode else None,
        created_at=int(time.time()),
    )
    try:
        reserved = await reserve_credit(gw.kube, namespace, entry)
    except APIError as exc:
        metrics.BATCHES_REFUSED.labels(exc.code or str(exc.status)).inc()
        raise
    return Admitted(estimate, reserved)


@capped_router.post("/batches", response_model=Batch)
async def create_batch(
    body: CreateBatchRequest,
    who: Writer,
    gw: GW,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=512)] = None,
) -> Response:
    """Create a batch from an uploaded file or inline requests (exactly one)."""
    if body.completion_window != "24h":
        raise APIError(
            400,
            f"Invalid value for 'completion_window': {body.completion_window[:32]!r}. "
            "Supported values are: '24h'.",
            param="completion_window",
            code="invalid_value",
        )
    endpoint = normalize_endpoint(body.endpoint)
    if endpoint is None:
        raise APIError(
            400,
            f"Invalid value for 'endpoint': {body.endpoint[:100]!r}. Supported values are: "
            "'/v1/chat/completions', '/v1/completions' and '/v1/embeddings' "
            "(or their /openai/v1/... spellings).",
            param="endpoint",
            code="invalid_value",
        )
    if (body.input_file_id is None) == (body.requests is None):
        raise APIError(
            400,
            "Provide exactly one of 'input_file_id' and 'requests'.",
            param="input_file_id",
            code="invalid_value",
        )
    _check_metadata(body.metadata)
    output_expiry = _output_expiry_seconds(body.output_expires_after)
    priority = body.priority or "standard"
    if priority not in ("standard", "expedited"):
        raise APIError(
            400,
            f"Invalid value for 'priority': {priority[:32]!r}. Supported values are: "
            "'standard' and 'expedited'.",
            param="priority",
            code="invalid_value",
        )
    flex = (body.metadata or {}).get("tier") == "flex"
    if flex and priority == "expedited":
        raise APIError(
            400,
            "metadata.tier 'flex' cannot be combined with priority 'expedited'.",
            param="priority",
            code="invalid_value",
        )
    inline: list[dict[str, Any]] | None = None
    request_count = 0
    if body.requests is not None:
        inline = _check_inline(body.requests, endpoint)
        request_count = len(inline)
    fingerprint = _fingerprint(body, inline)

    # An idempotent replay answers before any check that depends on the current state.
    if idempotency_key is not None:
        name, label = _idempotency(who.namespace, idempotency_key)
        existing = await gw.kube.get("batches", who.namespace, name)
        if existing is not None:
            return _replay(existing, fingerprint)
    else:
        name, label = "batch-" + secrets.token_hex(12), ""

    file_obj: dict[str, Any] | None = None
    if body.input_file_id is not None:
        file_obj = await _input_file(gw, who.namespace, body.input_file_id, endpoint)
        request_count = int((file_obj.get("spec") or {}).get("lineCount") or 0)

    annotations = await gw.kube.namespace_annotations(who.namespace)
    if annotations is None:
        raise APIError(
            403,
            f"The organization of this key ({who.namespace}) is not provisioned.",
            type="permission_error",
            code="organization_not_found",
        )
    if (
        priority == "expedited"
        and annotations.get(NAMESPACE_EXPEDITED_DISABLED, "").lower() == "true"
    ):
        raise APIError(
            400,
            "Expedited priority is disabled for your organization.",
            param="priority",
            code="expedited_not_allowed",
        )
    now_ns = time.time_ns()
    spec_fields: dict[str, Any] = {
        "endpoint": endpoint,
        "completionWindow": "24h",
        "priority": "flex" if flex else priority,
    }
    if body.input_file_id is not None:
        spec_fields["inputFileID"] = body.input_file_id
    else:
        spec_fields["requests"] = inline
    if body.metadata is not None:
        spec_fields["metadata"] = body.metadata
    if body.model:
        spec_fields["model"] = body.model
    if output_expiry is not None:
        spec_fields["outputExpiresAfterSeconds"] = output_expiry
    try:
        spec = BatchSpec.model_validate(spec_fields).to_k8s()
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        raise APIError(
            400, f"Invalid request: {first.get('msg')}.", param=None, code="invalid_value"
        ) from exc
    if file_obj is not None:
        size, model = _file_size(file_obj, request_count)
    else:
        size, model = _inline_size(inline or [], endpoint)
    admitted = await _admit(
        gw,
        who.namespace,
        annotations,
        name,
        "flex" if flex else priority,
        size,
        model,
        "input_file_id" if file_obj is not None else "requests",
    )

    meta: dict[str, Any] = {
        "name": name,
        "namespace": who.namespace,
        "annotations": {
            ANNOTATION_CREATED_NS: str(now_ns),
            ANNOTATION_REQUESTS: str(request_count),
            ANNOTATION_IDEMPOTENCY_INPUT: fingerprint,
            ANNOTATION_ESTIMATED_TOKENS: str(admitted.estimate.tokens),
        },
    }
    if label:
        meta["labels"] = {LABEL_IDEMPOTENCY: label}
    manifest = {"apiVersion": API_VERSION, "kind": "Batch", "metadata": meta, "spec": spec}
    # The reservation is keyed by the name, so it is the hold of whichever Batch gets the name.
    # It is given back only when no Batch has it; any other failure (a timeout, say) may have
    # created the Batch server-side, and the operator's upkeep drops a reservation whose Batch
    # never appeared after 5 minutes.
    try:
        created = await gw.kube.create("batches", who.namespace, manifest)
    except Conflict as exc:  # a concurrent create with the same Idempotency-Key won
        existing = await gw.kube.get("batches", who.namespace, name)
        if existing is None and admitted.reserved:
            await release_credit(gw.kube, who.namespace, name)
        if existing is None or not label:
            raise APIError(
                409, "The batch is being created concurrently; retry.", code="conflict"
            ) from exc
        if admitted.reserved:  # this request's reservation holds the winner's batch
            metrics.CREDITS_RESERVED.inc(float(admitted.estimate.amount))
        return _replay(existing, fingerprint)
    gw.reads.put("batches", who.namespace, name, created)
    metrics.BATCHES_CREATED.inc()
    if admitted.reserved:
        metrics.CREDITS_RESERVED.inc(float(admitted.estimate.amount))
    return _json(batch_to_openai(created))


async def _input_file(gw: Gateway, namespace: str, file_id: str, endpoint: str) -> dict[str, Any]:
    obj = await gw.reads.get("batchfiles", namespace, file_id) if FILE_ID.match(file_id) else None
    if obj is None:
        raise APIError(
            404, f"No such File object: {file_id[:128]!r}.", param="input_file_id", code=None
        )
    spec = obj.get("spec") or {}
    if spec.get("purpose") != "batch":
        raise APIError(
            400,
            f"File {file_id} has purpose {spec.get('purpose')!r}; a batch needs a file uploaded "
            "with purpose 'batch'.",
            param="input_file_id",
            code="invalid_file_purpose",
        )
    file_endpoint = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_ENDPOINT)
    if file_endpoint and file_endpoint != endpoint:
        raise APIError(
            400,
            f"The requests in {file_id} call {file_endpoint}, but the batch endpoint is "
            f"{endpoint}; every url in the file must match the batch's endpoint.",
            param="endpoint",
            code="mismatched_endpoint",
        )
    return obj


async def _get_batch(gw: Gateway, namespace: str, batch_id: str) -> dict[str, Any]:
    if not BATCH_ID.match(batch_id):
        raise not_found("batch", batch_id, "batch_id")
    obj = await gw.reads.get("batches", namespace, batch_object_name(batch_id))
    if obj is None:
        raise not_found("batch", batch_id, "batch_id")
    return obj


def _openai_name(obj: dict[str, Any]) -> bool:
    return str((obj.get("metadata") or {}).get("name", "")).startswith("batch-")


@router.get("/batches", response_model=ListPage[Batch])
async def list_batches(
    who: Reader,
    gw: GW,
    after: Annotated[str | None, Query(max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> Response:
    """The tenant's batches, newest first."""
    items = [b for b in await gw.kube.list_objects("batches", who.namespace) if _openai_name(b)]
    items.sort(key=batch_sort_key, reverse=True)

    def ident(obj: dict[str, Any]) -> str:
        return batch_id_from_name(obj["metadata"]["name"])

    try:
        page, more = paginate(items, ident, after, limit)
    except CursorNotFound as exc:
        raise APIError(400, f"No such batch to list after: {after!r}.", param="after") from exc
    batches = [batch_to_openai(b) for b in page]
    return _json(list_page(batches, more, lambda b: b.id))


@router.get("/batches/{batch_id}", response_model=Batch)
async def retrieve_batch(batch_id: str, who: Reader, gw: GW) -> Response:
    return _json(batch_to_openai(await _get_batch(gw, who.namespace, batch_id)))


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
        return _json(batch_to_openai(obj))
    patched = await gw.kube.patch(
        "batches",
        who.namespace,
        obj["metadata"]["name"],
        {
            "metadata": {"annotations": {ANNOTATION_CANCEL_AT: str(int(time.time()))}},
            "spec": {"cancel": True},
        },
    )
    gw.reads.put("batches", who.namespace, obj["metadata"]["name"], patched)
    if patched is None:
        raise not_found("batch", batch_id, "batch_id")
    return _json(batch_to_openai(patched))


# --- models ------------------------------------------------------------------------------------


def _catalog_max_requests(spec: dict[str, Any]) -> int | None:
    """The pool's per-batch request cap; None for a spec the models reject (not served)."""
    try:
        return max_requests(BatchPoolSpec.model_validate(spec))
    except PydanticValidationError as exc:
        log.warning("pool spec not understood, left out of /v1/models: %s", exc)
        return None


def model_catalog(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``GET /v1/models`` data: one entry per served model; ``batch`` names the pools."""
    entries: dict[str, dict[str, Any]] = {}
    for pool in sorted(pools, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        meta = pool.get("metadata") or {}
        spec = pool.get("spec") or {}
        tiers_spec = spec.get("tiers") or {}
        tiers: dict[str, Any] = {}
        for tier, window in (("standard", "24h"), ("flex", "72h"), ("expedited", "24h")):
            if tier == "expedited" and spec.get("expeditedAllowed") is False:
                continue
            pricing = (tiers_spec.get(tier) or {}).get("pricing") or {}
            tiers[tier] = {
                "completion_window": window,
                "currency": pricing.get("currency", "USD"),
                "input_per_million": pricing.get("inputPerMillion", "0"),
                "output_per_million": pricing.get("outputPerMillion", "0"),
            }
        limits = spec.get("limits") or {}
        cap = _catalog_max_requests(spec)
        if cap is None:
            continue
        for model in spec.get("models") or []:
            model_id = str(model.get("name") or "")
            if not model_id:
                continue
            entry = entries.get(model_id)
            if entry is None:
                entries[model_id] = {
                    "id": model_id,
                    "object": "model",
                    "created": k8s_time(meta.get("creationTimestamp")) or 0,
                    "owned_by": "llmbatch",
                    "batch": {
                        "pool": meta.get("name"),
                        "pools": [meta.get("name")],
                        "revision": model.get("revision"),
                        "endpoints": (
                            ["/v1/embeddings"]
                            if model.get("runner") == "pooling"
                            else ["/v1/chat/completions", "/v1/completions"]
                        ),
                        "tiers": tiers,
                        "expedited": "expedited" in tiers,
                        "limits": {
                            "max_requests": cap,
                            "max_bytes": limits.get("maxBytes", 268435456),
                        },
                    },
                }
            else:
                entry["batch"]["pools"].append(meta.get("name"))
    return [entries[k] for k in sorted(entries)]


@router.get("/models")
async def list_models(who: Reader, gw: GW) -> Response:
    """The model catalog: every model a BatchPool serves (``batch`` is non-null)."""
    data = model_catalog(await gw.kube.list_pools())
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, who: Reader, gw: GW) -> Response:
    for entry in model_catalog(await gw.kube.list_pools()):
        if entry["id"] == model_id:
            return Response(orjson.dumps(entry), media_type="application/json")
    raise not_found("model", model_id, "model")


# --- the app -----------------------------------------------------------------------------------


def create_app(
    settings: GatewaySettings | None = None,
    *,
    kube: KubeAPI | None = None,
    store: ObjectStore | None = None,
) -> FastAPI:
    """The gateway app; settings from the environment unless given (see docs/gateway.md)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cfg = settings or GatewaySettings.from_env()
        own_kube = kube is None
        kube_api: KubeAPI = kube or await GatewayKube.connect(cfg.kubeconfig)
        ring = KeyRing()
        app.state.gateway = Gateway(
            cfg,
            kube_api,
            store or open_store(cfg.store_uri),
            ring,
            ReadCache(kube_api, cfg.read_cache_seconds),
        )
        watcher = KeyWatcher(kube_api, cfg.gateway_namespace, ring, cfg.key_resync_seconds)
        watcher.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watcher.first_sync.wait(), timeout=10)
        # The imported modules (the Kubernetes client's models above all) are ~100k long-lived
        # objects; moving them out of the collector's view keeps full collections from pausing
        # requests for tens of milliseconds.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await watcher.stop()
            if own_kube:
                await kube_api.close()

    app = FastAPI(
        title="llm-batch-operator gateway",
        version="0.1.0",
        description="OpenAI-compatible Files, Batches and Models API (served under /v1 and "
        "/openai/v1).",
        lifespan=lifespan,
        redirect_slashes=False,
    )
    install_handlers(app)
    for routes in (router, capped_router):
        app.include_router(routes, prefix="/v1")
        app.include_router(routes, prefix="/openai/v1", include_in_schema=False)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> Response:
        gw = _state(request)
        if not gw.keyring.loaded:
            return Response(b'{"status":"keys not loaded"}', 503, media_type="application/json")
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint(request: Request) -> Response:
        metrics.API_KEYS.set(len(_state(request).keyring))
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(metrics.MetricsMiddleware)

    def openapi() -> dict[str, Any]:
        # FastAPI documents 422 for validation errors; the gateway answers those with 400.
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    if isinstance(operation, dict):
                        operation.get("responses", {}).pop("422", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def bad_upload_error(problem: InvalidLine) -> APIError:  # re-exported for tests
    return bad_line_error(problem)
