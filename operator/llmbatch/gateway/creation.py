"""``POST /v1/batches`` without I/O: the checked request, admission's decisions, the manifest.

``parse_create_request`` turns the wire body into a :class:`BatchRequest` holding the typed
:class:`BatchSpec` (whose declared limits — metadata size, inline request count, output
lifetime — answer for themselves, mapped to OpenAI errors). The route
(``llmbatch.gateway.routes.batches``) does the reads and writes around these functions;
admission's decisions are ``llmbatch.gateway.admission``.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import ErrorDetails

from llmbatch.api.openai import endpoint_list
from llmbatch.api.resources import (
    API_VERSION,
    BATCH_FINALIZER,
    BatchSpec,
    EndpointPath,
    FileMedia,
    InlineRequest,
    Tier,
)
from llmbatch.core.billing import RESERVED_ANNOTATION, BatchSize
from llmbatch.core.tiers import TIERS, expedited_disabled, tier_of
from llmbatch.core.validation import MediaTally, normalize_endpoint
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.inlinecheck import (
    InlineInput,
    InlineRequestIn,
    check_inline,
    inline_fingerprint,
)
from llmbatch.gateway.mapping import (
    ANNOTATION_CREATED_NS,
    ANNOTATION_ENDPOINT,
    ANNOTATION_ESTIMATED_TOKENS,
    ANNOTATION_IDEMPOTENCY_INPUT,
    ANNOTATION_REQUESTS,
    FILE_ID,
    LABEL_IDEMPOTENCY,
)

OUTPUT_EXPIRY = "output_expires_after"


# --- the wire body ------------------------------------------------------------------------------


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


# --- the checked request ------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchRequest:
    """A checked ``POST /v1/batches``: the spec to create and what admission needs."""

    spec: BatchSpec
    fingerprint: str
    """The input's identity for Idempotency-Key replays: the file id, or a hash of the requests."""
    inline: InlineInput | None = None

    @property
    def input_param(self) -> Literal["input_file_id", "requests"]:
        return "requests" if self.inline is not None else "input_file_id"


def parse_create_request(body: CreateBatchRequest) -> BatchRequest:
    """Check the wire body: a problem is a 400 naming its field (a malformed input_file_id is
    the 404 of an unknown one)."""
    _check_window(body.completion_window)
    endpoint = _endpoint(body.endpoint)
    if (body.input_file_id is None) == (body.requests is None):
        raise APIError(
            400,
            "Provide exactly one of 'input_file_id' and 'requests'.",
            param="input_file_id",
            code="invalid_value",
        )
    _check_metadata_keys(body.metadata)
    expiry = _output_expiry_seconds(body.output_expires_after)
    tier = _tier(body.priority, body.metadata)
    if body.input_file_id is not None and not FILE_ID.match(body.input_file_id):
        raise _no_such_file(body.input_file_id)
    requests: list[InlineRequest] | None = None
    inline: InlineInput | None = None
    if body.requests is not None:
        requests, inline = check_inline(body.requests, endpoint)
    try:
        spec = BatchSpec(
            endpoint=cast(EndpointPath, endpoint),
            input_file_id=body.input_file_id,
            requests=requests,
            priority=tier,
            metadata=body.metadata,
            model=body.model or None,
            output_expires_after_seconds=expiry,
        )
    except PydanticValidationError as exc:
        raise _spec_error(exc.errors()[0]) from exc
    fingerprint = str(body.input_file_id) if requests is None else inline_fingerprint(requests)
    return BatchRequest(spec, fingerprint, inline)


def _check_window(window: str) -> None:
    if window != "24h":
        raise APIError(
            400,
            f"Invalid value for 'completion_window': {window[:32]!r}. Supported values are: '24h'.",
            param="completion_window",
            code="invalid_value",
        )


def _endpoint(raw: str) -> str:
    endpoint = normalize_endpoint(raw)
    if endpoint is None:
        raise APIError(
            400,
            f"Invalid value for 'endpoint': {raw[:100]!r}. Supported values are: "
            f"{endpoint_list()} (or their /openai/v1/... spellings).",
            param="endpoint",
            code="invalid_value",
        )
    return endpoint


def _check_metadata_keys(metadata: dict[str, str] | None) -> None:
    """OpenAI's key rule (1 to 64 characters); the pair count and value length are BatchSpec's."""
    for key in metadata or {}:
        if not key or len(key) > 64:
            raise APIError(
                400,
                f"Invalid 'metadata': key {key[:70]!r} must be 1 to 64 characters long.",
                param="metadata",
                code="invalid_value",
            )


def _output_expiry_seconds(value: Any) -> int | None:
    """Seconds of ``output_expires_after`` (its range is BatchSpec's); None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise APIError(
            400,
            f"Invalid type for '{OUTPUT_EXPIRY}': expected an object with 'anchor' and 'seconds'.",
            param=OUTPUT_EXPIRY,
            code="invalid_type",
        )
    if value.get("anchor") != "created_at":
        raise APIError(
            400,
            f"Invalid value for '{OUTPUT_EXPIRY}.anchor': {str(value.get('anchor'))[:32]!r}. "
            "Supported values are: 'created_at'.",
            param=f"{OUTPUT_EXPIRY}.anchor",
            code="invalid_value",
        )
    seconds = value.get("seconds")
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise APIError(
            400,
            f"Invalid type for '{OUTPUT_EXPIRY}.seconds': expected an integer.",
            param=f"{OUTPUT_EXPIRY}.seconds",
            code="invalid_type",
        )
    return seconds


def _tier(priority: str | None, metadata: dict[str, str] | None) -> Tier:
    """The wire ``priority`` (standard | expedited; flex, as a batch reads it back), or flex
    when ``metadata.tier`` says so."""
    wanted = priority or "standard"
    if wanted not in TIERS:
        raise APIError(
            400,
            f"Invalid value for 'priority': {wanted[:32]!r}. Supported values are: "
            "'standard', 'expedited' and 'flex'.",
            param="priority",
            code="invalid_value",
        )
    tier = tier_of(wanted, metadata)
    if tier == "flex" and wanted == "expedited":
        raise APIError(
            400,
            "metadata.tier 'flex' cannot be combined with priority 'expedited'.",
            param="priority",
            code="invalid_value",
        )
    return tier


_WIRE_NAMES = {
    "inputFileID": "input_file_id",
    "completionWindow": "completion_window",
    "outputExpiresAfterSeconds": f"{OUTPUT_EXPIRY}.seconds",
    "output_expires_after_seconds": f"{OUTPUT_EXPIRY}.seconds",
}


def _spec_error(error: ErrorDetails) -> APIError:
    """A limit BatchSpec declares, broken: the OpenAI error naming the wire field."""
    loc = [str(part) for part in error["loc"]]
    param = _WIRE_NAMES.get(loc[0], loc[0])
    if loc[0] == "metadata" and len(loc) > 1:
        param = f"metadata.{loc[1]}"
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "too_long" and param == "requests":
        message = f"At most {ctx.get('max_length')} inline requests; upload a file for more."
        return APIError(400, message, param=param, code="too_many_requests")
    if kind == "too_long":
        got = ctx.get("actual_length") or len(value or ())
        message = (
            f"Invalid '{param}': too many properties. Expected at most {ctx.get('max_length')}, "
            f"got {got}."
        )
    elif kind == "string_too_long":
        message = (
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{ctx.get('max_length')}, but got a string with length {len(str(value))} instead."
        )
        return APIError(400, message, param=param, code="string_above_max_length")
    elif kind in ("greater_than_equal", "less_than_equal"):
        low, high = _declared_range(loc[0])
        message = (
            f"Invalid '{param}': expected a value between {low} and {high}, but got {value} "
            "instead."
        )
    else:
        message = f"Invalid value for '{param}': {error['msg']}."
    return APIError(400, message, param=param, code="invalid_value")


@functools.cache
def _declared_range(field: str) -> tuple[Any, Any]:
    """The ``minimum`` and ``maximum`` BatchSpec declares for ``field`` (alias or name)."""
    properties = BatchSpec.model_json_schema()["properties"]
    info = BatchSpec.model_fields.get(field)
    schema = properties.get(field) or properties.get(info.alias if info else "", {})
    for option in [schema, *schema.get("anyOf", [])]:
        if "minimum" in option or "maximum" in option:
            return option.get("minimum"), option.get("maximum")
    return None, None


def _no_such_file(file_id: str) -> APIError:
    return APIError(
        404, f"No such File object: {file_id[:128]!r}.", param="input_file_id", code=None
    )


# --- checks against what exists -----------------------------------------------------------------


def batch_name(namespace: str, idempotency_key: str | None) -> tuple[str, str]:
    """``(object name, idempotency label)``: one tenant's key always names the same batch;
    without a key, a random name and no label."""
    if idempotency_key is None:
        return "batch-" + secrets.token_hex(12), ""
    digest = hashlib.sha256(f"{namespace}\0{idempotency_key}".encode()).hexdigest()
    return "batch-" + digest[:24], digest[:63]


def check_replay(existing: dict[str, Any], fingerprint: str) -> dict[str, Any]:
    """The batch an Idempotency-Key named, if it was made from the same input (409 if not)."""
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_IDEMPOTENCY_INPUT) != fingerprint:
        raise APIError(
            409,
            "This Idempotency-Key was already used with a different input file; use a new key "
            "for a new batch.",
            param="Idempotency-Key",
            code="idempotency_key_reused",
        )
    return existing


def check_input_file(
    file_id: str, obj: dict[str, Any] | None, endpoint: str
) -> tuple[BatchSize, str | None]:
    """The input BatchFile's size and model: 404 unknown, 400 wrong purpose or endpoint."""
    if obj is None:
        raise _no_such_file(file_id)
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
    # What the upload's validation recorded (older files: no request declared an output limit).
    requests = int(spec.get("lineCount") or 0)
    without = spec.get("requestsWithoutOutputLimit")
    media = FileMedia.model_validate(spec.get("media") or {})
    size = BatchSize(
        input_bytes=int(spec.get("bytes") or 0),
        requests=requests,
        output_token_limits=int(spec.get("outputTokenLimits") or 0),
        requests_without_output_limit=int(requests if without is None else without),
        media=MediaTally(**media.model_dump()),
    )
    return size, spec.get("model")


def check_tenant(namespace: str, annotations: dict[str, str] | None, tier: Tier) -> dict[str, str]:
    """The tenant namespace's annotations: 403 when it does not exist, 400 for a tier it may
    not use."""
    if annotations is None:
        raise APIError(
            403,
            f"The organization of this key ({namespace}) is not provisioned.",
            type="permission_error",
            code="organization_not_found",
        )
    if tier == "expedited" and expedited_disabled(annotations):
        raise APIError(
            400,
            "Expedited priority is disabled for your organization.",
            param="priority",
            code="expedited_not_allowed",
        )
    return annotations


# --- the object ----------------------------------------------------------------------------------


def batch_manifest(
    name: str,
    namespace: str,
    request: BatchRequest,
    *,
    requests: int,
    estimated_tokens: int,
    idempotency_label: str,
    now_ns: int,
    credit_reserved: bool = False,
) -> dict[str, Any]:
    """The Batch to create: the spec plus what the gateway records for quotas and replays, and
    whether it reserved the batch's credit (``core.billing.RESERVED_ANNOTATION``)."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        # The operator's cleanup hold, set here: the operator need not add it with a write.
        "finalizers": [BATCH_FINALIZER],
        "annotations": {
            ANNOTATION_CREATED_NS: str(now_ns),
            ANNOTATION_REQUESTS: str(requests),
            ANNOTATION_IDEMPOTENCY_INPUT: request.fingerprint,
            ANNOTATION_ESTIMATED_TOKENS: str(estimated_tokens),
        },
    }
    if idempotency_label:
        meta["labels"] = {LABEL_IDEMPOTENCY: idempotency_label}
    if credit_reserved:
        meta["annotations"][RESERVED_ANNOTATION] = "true"
    return {
        "apiVersion": API_VERSION,
        "kind": "Batch",
        "metadata": meta,
        "spec": request.spec.to_k8s(),
    }
