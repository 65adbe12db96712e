"""``/v1/files``: uploads streamed into the store (each one a BatchFile), reads, downloads."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from llmbatch.api.openai import FileDeleted, FileObject, ListPage
from llmbatch.api.resources import API_VERSION, FileMedia
from llmbatch.core import keys
from llmbatch.core.quotas import TenantCaps, storage_refusal, storage_room
from llmbatch.gateway import metrics
from llmbatch.gateway.admission import refusal_error, upload_limits
from llmbatch.gateway.deps import GW, Gateway, Reader, Writer
from llmbatch.gateway.errors import APIError, not_found, store_unavailable
from llmbatch.gateway.mapping import (
    ANNOTATION_CREATED_NS,
    ANNOTATION_ENDPOINT,
    FILE_ID,
    INPUT_FILE_TTL,
    CursorNotFound,
    file_sort_key,
    file_to_openai,
    list_envelope,
    paginate,
)
from llmbatch.gateway.responses import ERROR_RESPONSES, json_data, json_response
from llmbatch.gateway.tenants import caller_tenant
from llmbatch.gateway.upload import MultipartUpload, StoredUpload
from llmbatch.gateway.uploadcheck import MAX_EXPIRES_SECONDS, MIN_EXPIRES_SECONDS
from llmbatch.storage import ObjectNotFound, StoreError

log = logging.getLogger(__name__)

MAX_RECORDED_MODEL = 256
"""Longest model name a BatchFile records (``spec.model`` is ShortText, as pools' names are)."""

router = APIRouter(responses=ERROR_RESPONSES)

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
                        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
                        "expires_after[seconds]": {
                            "type": "integer",
                            "minimum": MIN_EXPIRES_SECONDS,
                            "maximum": MAX_EXPIRES_SECONDS,
                        },
                    },
                }
            }
        },
    }
}


@router.post("/files", response_model=FileObject, openapi_extra=_UPLOAD_SCHEMA)
async def create_file(request: Request, who: Writer, gw: GW) -> Response:
    """Upload a batch input file (multipart ``file``, ``purpose=batch``), checked as it streams.

    Optional ``expires_after[anchor]=created_at`` and ``expires_after[seconds]`` (as the openai
    SDK sends ``expires_after``) set the file's lifetime; the default is 24 h.
    """
    file_id = keys.new_file_id()
    key = keys.file_key(who.namespace, file_id)
    most, over = await _upload_room(gw, who.namespace)
    pools = await gw.kube.list_pools()
    tenant = await caller_tenant(gw, who.namespace, pools)
    upload = MultipartUpload(
        request,
        gw.store,
        key,
        most,
        lambda base, model: upload_limits(base, pools, model, tenant, gw.settings.remote_media),
        over=over,
    )
    stored = await _store(upload)
    try:
        if "purpose" not in upload.fields:
            raise APIError(
                400, "Missing required parameter: 'purpose'.", param="purpose", code="missing"
            )
        manifest = batchfile_manifest(
            who.namespace, file_id, key, stored, upload.filename, upload.expires_after
        )
        obj = await gw.kube.create("batchfiles", who.namespace, manifest)
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(gw.store.delete, key)
        raise
    gw.reads.put("batchfiles", who.namespace, file_id, obj)
    gw.lists.files.put(obj)  # listed at once: a client lists what it just uploaded
    metrics.UPLOAD_BYTES.inc(stored.info.size)
    return json_response(file_to_openai(obj))


async def _upload_room(gw: Gateway, namespace: str) -> tuple[int, APIError | None]:
    """The largest upload the tenant may send now, and the answer past it when that is its
    storage cap rather than the upload cap (None: 413 as usual). 400
    ``storage_quota_exceeded`` at once when its files already fill its cap."""
    caps = TenantCaps.of(
        await gw.kube.namespace_annotations(namespace) or {}, gw.settings.tenant_caps
    )
    stored = await _stored_bytes(gw, namespace)
    room = storage_room(stored, caps.stored_bytes)
    if room is None or caps.stored_bytes is None or room >= gw.settings.max_upload_bytes:
        return gw.settings.max_upload_bytes, None
    refused = refusal_error(storage_refusal(stored, caps.stored_bytes))
    if room == 0:
        metrics.UPLOADS_REJECTED.labels(refused.code or "400").inc()
        raise refused
    return room, refused


async def _stored_bytes(gw: Gateway, namespace: str) -> int:
    """The bytes of the tenant's files: from the listing cache once synced, else a listing."""
    if gw.lists.files.synced:
        return gw.lists.files.index.total(namespace)
    files = await gw.kube.list_objects("batchfiles", namespace)
    return sum(int((f.get("spec") or {}).get("bytes") or 0) for f in files)


async def _store(upload: MultipartUpload) -> StoredUpload:
    """Run the upload into the store; a refusal is counted by its code."""
    try:
        stored = await upload.run()
    except APIError as exc:
        metrics.UPLOADS_REJECTED.labels(exc.code or str(exc.status)).inc()
        raise
    except StoreError as exc:
        log.warning("upload to the store failed: %s", exc)
        raise store_unavailable() from exc
    if stored is None:
        raise APIError(400, "Missing required parameter: 'file'.", param="file", code="missing")
    return stored


def batchfile_manifest(
    namespace: str,
    file_id: str,
    key: str,
    stored: StoredUpload,
    filename: str | None,
    expires_after: int | None = None,
) -> dict[str, Any]:
    """The BatchFile of a validated upload: what the estimate and the operator need of it.

    ``expires_after`` (seconds, already checked) replaces the 24 h default lifetime.
    """
    now_ns = time.time_ns()
    created = now_ns // 1_000_000_000
    result = stored.result
    spec: dict[str, Any] = {
        "id": file_id,
        "bytes": stored.info.size,
        "filename": filename or "upload.jsonl",
        "purpose": "batch",
        "sha256": stored.info.sha256,
        "lineCount": result.request_count,
        "outputTokenLimits": result.declared_output_tokens,
        "requestsWithoutOutputLimit": result.requests_without_output_limit,
        "storageKey": key,
        "createdAt": created,
        "expiresAt": created + (expires_after or INPUT_FILE_TTL),
    }
    if expires_after is not None:
        spec["expiresAfterSeconds"] = expires_after
    if not result.media.empty:
        spec["media"] = FileMedia(**dataclasses.asdict(result.media)).to_k8s()
    # Longer than BatchFile.spec.model allows, it names no pool anyway: left off, the batch is
    # estimated as one without a pool and validation fails it (model_not_found).
    if result.model and len(result.model) <= MAX_RECORDED_MODEL:
        spec["model"] = result.model
    annotations = {ANNOTATION_CREATED_NS: str(now_ns), ANNOTATION_ENDPOINT: stored.endpoint}
    return {
        "apiVersion": API_VERSION,
        "kind": "BatchFile",
        "metadata": {"name": file_id, "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


async def get_file(gw: Gateway, namespace: str, file_id: str) -> dict[str, Any]:
    """The tenant's BatchFile (404 for an unknown id or another tenant's)."""
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
    """The tenant's files, newest first (``order=asc`` for oldest first): from the listing
    cache once it is synced."""
    descending = order == "desc"
    try:
        if gw.lists.files.synced:
            page, more = gw.lists.files.index.page_after(
                who.namespace, after, limit, descending=descending, group=purpose or None
            )
        else:
            page, more = await _listed_by_the_api(
                gw, who.namespace, after, limit, descending, purpose
            )
    except CursorNotFound as exc:
        raise APIError(400, f"No such file to list after: {after!r}.", param="after") from exc
    return json_data(list_envelope(page, more))


async def _listed_by_the_api(
    gw: Gateway,
    namespace: str,
    after: str | None,
    limit: int,
    descending: bool,
    purpose: str | None,
) -> tuple[list[dict[str, Any]], bool]:
    """A page from a listing of the tenant's files (the way before the cache, for its start)."""
    items = await gw.kube.list_objects("batchfiles", namespace)
    if purpose:
        items = [i for i in items if (i.get("spec") or {}).get("purpose") == purpose]
    items.sort(key=file_sort_key, reverse=descending)
    files = [file_to_openai(i).model_dump(mode="json") for i in items]
    return paginate(files, lambda f: str(f["id"]), after, limit)


@router.get("/files/{file_id}", response_model=FileObject)
async def retrieve_file(file_id: str, who: Reader, gw: GW) -> Response:
    return json_response(file_to_openai(await get_file(gw, who.namespace, file_id)))


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def file_content(file_id: str, who: Reader, gw: GW) -> StreamingResponse:
    """The file's bytes, streamed from the store."""
    obj = await get_file(gw, who.namespace, file_id)
    key = keys.owned_file_key(who.namespace, file_id, (obj.get("spec") or {}).get("storageKey"))
    if key is None:
        raise not_found("File object", file_id, "file_id")
    try:
        chunks = await asyncio.to_thread(gw.store.iter_range, key)
    except ObjectNotFound as exc:
        raise not_found("File object", file_id, "file_id") from exc
    except (StoreError, ValueError) as exc:
        raise store_unavailable() from exc

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
    obj = await get_file(gw, who.namespace, file_id)
    key = keys.owned_file_key(who.namespace, file_id, (obj.get("spec") or {}).get("storageKey"))
    try:
        if key is not None:  # a foreign storageKey: drop the object, never those bytes
            await asyncio.to_thread(gw.store.delete, key)
    except (StoreError, ValueError) as exc:
        raise store_unavailable() from exc
    deleted = await gw.kube.delete("batchfiles", who.namespace, file_id)
    gw.reads.put("batchfiles", who.namespace, file_id, None)
    gw.lists.files.drop(obj)
    if not deleted:
        raise not_found("File object", file_id, "file_id")
    return json_response(FileDeleted(id=file_id))
