"""Pure mapping between the custom resources and the OpenAI wire objects, and list pagination."""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast, get_args

from llmbatch.api.openai import (
    TERMINAL_STATUSES,
    Batch,
    BatchError,
    BatchErrors,
    BatchRequestCounts,
    BatchStatus,
    BatchUsage,
    FileObject,
    FilePurpose,
    InputTokensDetails,
    ListPage,
    OutputTokensDetails,
    Priority,
)
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.tiers import DEFAULT_WINDOW, completion_window, tier_of

ANNOTATION_CREATED_NS = "llmbatch.io/created-ns"
ANNOTATION_CANCEL_AT = "llmbatch.io/cancel-requested-at"
ANNOTATION_REQUESTS = "llmbatch.io/requests"
ANNOTATION_ENDPOINT = "llmbatch.io/endpoint"
ANNOTATION_IDEMPOTENCY_INPUT = "llmbatch.io/idempotency-input"
ANNOTATION_ESTIMATED_TOKENS = "llmbatch.io/estimated-tokens"
LABEL_IDEMPOTENCY = "llmbatch.io/idempotency-key"
FILE_ID = re.compile(r"^file-[0-9a-f]{32}$")
"""An OpenAI file id the gateway issues (and the BatchFile's name)."""
BATCH_ID = re.compile(r"^batch_[a-z0-9]([-a-z0-9.]{0,240}[a-z0-9])?$")
"""An OpenAI batch id: ``batch_`` + the rest of a Batch object name."""

INPUT_FILE_TTL = 86400
DAY = 86400
_UNITS = {"s": 1, "m": 60, "h": 3600}
_PHASES = frozenset(get_args(BatchStatus))

T = TypeVar("T")


def k8s_time(stamp: str | None) -> int | None:
    """Unix seconds of an RFC 3339 ``...Z`` timestamp, None when absent or unreadable."""
    if not stamp:
        return None
    try:
        return calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def window_seconds(window: str | None) -> int:
    if window and len(window) >= 2 and window[-1] in _UNITS and window[:-1].isdigit():
        return int(window[:-1]) * _UNITS[window[-1]]
    return DAY


def created_ns(obj: dict[str, Any], fallback_seconds: int | None = None) -> int:
    """Creation time in nanoseconds: our annotation, else the object's timestamps."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANNOTATION_CREATED_NS)
    if raw and raw.isdigit():
        return int(raw)
    seconds = fallback_seconds
    if seconds is None:
        seconds = k8s_time(meta.get("creationTimestamp")) or 0
    # Second precision only (objects made by the operator or kubectl): order them after anything
    # the gateway created within the same second (an output file follows its input).
    return seconds * 1_000_000_000 + 999_999_999


def batch_created_at(obj: dict[str, Any]) -> int:
    status = obj.get("status") or {}
    if isinstance(status.get("createdAt"), int):
        return int(status["createdAt"])
    # creationTimestamp first: the operator settles status.createdAt from it, so the answer to
    # the create call and every later read agree.
    meta = obj.get("metadata") or {}
    stamp = k8s_time(meta.get("creationTimestamp"))
    if stamp is not None:
        return stamp
    raw = (meta.get("annotations") or {}).get(ANNOTATION_CREATED_NS)
    if raw and raw.isdigit():
        return int(raw) // 1_000_000_000
    return int(time.time())


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def batch_to_openai(obj: dict[str, Any]) -> Batch:
    """The OpenAI Batch object of a Batch custom resource (status as far as the operator wrote it).

    Before the operator has written any status the batch reads ``validating``; a cancel the
    operator has not acted on yet reads ``cancelling`` (with ``cancelling_at`` from the request).
    """
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    created = batch_created_at(obj)
    phase, cancelling_at = _phase(spec, status, meta.get("annotations") or {}, created)
    counts = status.get("requestCounts") or {}
    metadata = spec.get("metadata")
    priority: Priority = tier_of(
        spec.get("priority"), metadata if isinstance(metadata, dict) else None
    )
    return Batch(
        id=batch_id_from_name(meta["name"]),
        endpoint=str(spec.get("endpoint") or ""),
        model=_model(spec, status),
        errors=_errors(status.get("errors")),
        input_file_id=str(spec.get("inputFileID") or ""),
        completion_window=str(spec.get("completionWindow") or "24h"),
        status=phase,
        output_file_id=status.get("outputFileID"),
        error_file_id=status.get("errorFileID"),
        created_at=created,
        in_progress_at=_int_or_none(status.get("inProgressAt")),
        expires_at=_expires_at(spec, status, created),
        finalizing_at=_int_or_none(status.get("finalizingAt")),
        completed_at=_int_or_none(status.get("completedAt")),
        failed_at=_int_or_none(status.get("failedAt")),
        expired_at=_int_or_none(status.get("expiredAt")),
        cancelling_at=cancelling_at,
        cancelled_at=_int_or_none(status.get("cancelledAt")),
        request_counts=BatchRequestCounts(
            total=int(counts.get("total") or 0),
            completed=int(counts.get("completed") or 0),
            failed=int(counts.get("failed") or 0),
        ),
        usage=_usage(status.get("usage")),
        metadata=dict(metadata) if isinstance(metadata, dict) else None,
        priority=priority,
        model_revision=status.get("modelRevision") or None,
    )


def _model(spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    """The model id the batch runs, settled from the input file at acceptance (before, the
    display hint as asked): an id ``/v1/models`` lists and a request can use. The revision
    acceptance pinned is ``model_revision``, a field of its own."""
    return status.get("model") or spec.get("model") or None


def _phase(
    spec: dict[str, Any], status: dict[str, Any], annotations: dict[str, str], created: int
) -> tuple[BatchStatus, int | None]:
    """The status to show and ``cancelling_at`` (a pending cancel reads ``cancelling``)."""
    raw_phase = status.get("status")
    phase = cast(BatchStatus, raw_phase if raw_phase in _PHASES else "validating")
    cancelling_at = _int_or_none(status.get("cancellingAt"))
    if spec.get("cancel") and phase not in TERMINAL_STATUSES and phase != "cancelling":
        phase = "cancelling"
        if cancelling_at is None:
            raw = annotations.get(ANNOTATION_CANCEL_AT, "")
            cancelling_at = int(raw) if raw.isdigit() else created
    return phase, cancelling_at


def _expires_at(spec: dict[str, Any], status: dict[str, Any], created: int) -> int:
    expires = _int_or_none(status.get("expiresAt"))
    if expires is not None:
        return expires
    metadata = spec.get("metadata")
    tier = tier_of(spec.get("priority"), metadata if isinstance(metadata, dict) else None)
    requested = str(spec.get("completionWindow") or DEFAULT_WINDOW)
    return created + window_seconds(completion_window(tier, requested))


def _errors(errors: Any) -> BatchErrors | None:
    if not errors:
        return None
    return BatchErrors(data=[BatchError.model_validate(e) for e in errors if isinstance(e, dict)])


def _usage(usage: Any) -> BatchUsage | None:
    if not isinstance(usage, dict):
        return None
    return BatchUsage(
        input_tokens=int(usage.get("inputTokens") or 0),
        input_tokens_details=InputTokensDetails(cached_tokens=int(usage.get("cachedTokens") or 0)),
        output_tokens=int(usage.get("outputTokens") or 0),
        output_tokens_details=OutputTokensDetails(
            reasoning_tokens=int(usage.get("reasoningTokens") or 0)
        ),
        total_tokens=int(usage.get("totalTokens") or 0),
    )


def file_to_openai(obj: dict[str, Any]) -> FileObject:
    """The OpenAI File object of a BatchFile custom resource."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    created = int(
        spec.get("createdAt") or k8s_time((obj.get("metadata") or {}).get("creationTimestamp")) or 0
    )
    purpose: FilePurpose = "batch_output" if spec.get("purpose") == "batch_output" else "batch"
    # The operator's retention plan (status) wins over what was set at creation (spec).
    expires = _int_or_none(status.get("expiresAt"))
    if expires is None:
        expires = _int_or_none(spec.get("expiresAt"))
    if expires is None and purpose == "batch":
        expires = created + INPUT_FILE_TTL
    file_status = status.get("status")
    return FileObject(
        id=str(spec.get("id") or (obj.get("metadata") or {}).get("name")),
        bytes=int(spec.get("bytes") or 0),
        created_at=created,
        filename=str(spec.get("filename") or ""),
        purpose=purpose,
        status=file_status if file_status in ("uploaded", "processed", "error") else "processed",
        expires_at=expires,
    )


def batch_sort_key(obj: dict[str, Any]) -> tuple[int, str]:
    return created_ns(obj), str((obj.get("metadata") or {}).get("name", ""))


def file_sort_key(obj: dict[str, Any]) -> tuple[int, str]:
    spec = obj.get("spec") or {}
    created = spec.get("createdAt")
    return (
        created_ns(obj, created if isinstance(created, int) else None),
        str((obj.get("metadata") or {}).get("name", "")),
    )


class CursorNotFound(LookupError):
    """``after`` names no item of the list."""


def paginate(
    items: Sequence[T], ident: Callable[[T], str], after: str | None, limit: int
) -> tuple[list[T], bool]:
    """The page of ``items`` (already in list order) after the item ``after``; and has_more."""
    start = 0
    if after:
        for index, item in enumerate(items):
            if ident(item) == after:
                start = index + 1
                break
        else:
            raise CursorNotFound(after)
    page = list(items[start : start + limit])
    return page, start + limit < len(items)


def list_envelope(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """The list envelope of objects already in wire form: :func:`list_page`, dumped."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def list_page(data: list[T], has_more: bool, ident: Callable[[T], str]) -> ListPage[T]:
    return ListPage[T](
        data=data,
        first_id=ident(data[0]) if data else None,
        last_id=ident(data[-1]) if data else None,
        has_more=has_more,
    )
