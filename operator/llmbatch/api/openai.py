"""OpenAI wire types: the JSON our users' clients send and parse.

Shapes follow the official ``openai`` SDK models (``openai.types.Batch``, ``FileObject``, ...) and
``shared/openai-batch-contract.md``; unit tests round-trip them through the SDK.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
"""Lifecycle of a batch: validating → in_progress → finalizing → completed | failed | expired;
cancelling → cancelled."""

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "expired", "cancelled"})

Endpoint = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"]
"""Endpoints a batch may call (the ``/openai/v1/...`` spellings normalise to these). The one list:
the Batch CRD, the shard spec, validation, the gateway's messages and the model catalog use it."""

ENDPOINTS: tuple[Endpoint, ...] = get_args(Endpoint)
"""The values of :data:`Endpoint`, in order."""
GENERATE_ENDPOINTS: tuple[Endpoint, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
)
"""Endpoints a generate model (``runner: generate``) serves."""
POOLING_ENDPOINTS: tuple[Endpoint, ...] = ("/v1/embeddings",)
"""Endpoints a pooling model (``runner: pooling``) serves."""


def endpoint_list(conjunction: str = "and") -> str:
    """The endpoints for a message: ``'/v1/chat/completions', ... and '/v1/responses'``."""
    quoted = [f"'{e}'" for e in ENDPOINTS]
    return f"{', '.join(quoted[:-1])} {conjunction} {quoted[-1]}"


Priority = Literal["standard", "expedited", "flex"]
"""The tier a batch runs and is billed at (a provider extension): flex is asked for with
``metadata.tier = "flex"`` and reads ``flex`` here."""
FilePurpose = Literal["batch", "batch_output"]

MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]
Metadata = Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)]
"""Up to 16 pairs; keys ≤ 64 characters, values ≤ 512 characters."""


class WireModel(BaseModel):
    """Base of every wire type: tolerant of extra fields a newer client may send."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)


# --- input and result lines ----------------------------------------------------------------


class BatchRequestLine(WireModel):
    """One line of a batch input file."""

    custom_id: str = Field(description="Caller's id, unique within the file.")
    method: Literal["POST"] = Field(description="HTTP method; always POST.")
    url: str = Field(description="Endpoint path; must equal the batch endpoint.")
    body: dict[str, Any] = Field(description="The request body the endpoint takes.")


class BatchResponse(WireModel):
    """The HTTP response a request received (success or model-side error)."""

    status_code: int = Field(description="HTTP status code the endpoint answered.")
    request_id: str = Field(description="Deterministic id of this request's execution.")
    body: dict[str, Any] = Field(description="Response body (or an OpenAI error envelope).")


class BatchLineError(WireModel):
    """Why a request has no response at all (it never ran)."""

    code: str = Field(description="Stable error code, e.g. batch_expired or batch_cancelled.")
    message: str = Field(description="Human-readable explanation.")


class BatchOutputLine(WireModel):
    """One line of an output or error file."""

    id: str = Field(description="batch_req_... id, derived from the batch uid and custom_id.")
    custom_id: str = Field(description="The caller's custom_id from the input line.")
    response: BatchResponse | None = Field(description="The response, when the request ran.")
    error: BatchLineError | None = Field(description="Why there is no response, otherwise null.")


# --- the Batch object ---------------------------------------------------------------------


class BatchRequestCounts(WireModel):
    """Request counts; completed + failed == total once the batch is terminal."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(WireModel):
    """One validation error of the input file."""

    code: str | None = None
    message: str | None = None
    param: str | None = None
    line: int | None = None


class BatchErrors(WireModel):
    """The ``errors`` list of a failed batch."""

    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class InputTokensDetails(WireModel):
    cached_tokens: int = 0


class OutputTokensDetails(WireModel):
    reasoning_tokens: int = 0


class BatchUsage(WireModel):
    """Token usage summed over the successful requests of the final output file."""

    input_tokens: int = 0
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = 0
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int = 0


class Batch(WireModel):
    """The OpenAI Batch object."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None = None
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str = "24h"
    status: BatchStatus
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: BatchRequestCounts = Field(default_factory=BatchRequestCounts)
    usage: BatchUsage | None = None
    metadata: dict[str, str] | None = None
    priority: Priority = "standard"
    model_revision: str | None = None
    """Provider extension: the revision of ``model`` acceptance pinned (every request of the
    batch runs it); null before acceptance, or where the pool names no revision."""

    @field_validator("request_counts", mode="before")
    @classmethod
    def _counts_default(cls, value: Any) -> Any:
        # The SDK models request_counts as optional; ours always carries all three numbers.
        return {} if value is None else value

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_default(cls, value: Any) -> Any:
        # Batches created before the tier existed read as standard.
        return "standard" if value is None else value


class FileObject(WireModel):
    """The OpenAI File object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: FilePurpose
    status: Literal["uploaded", "processed", "error"] = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(WireModel):
    """Answer to ``DELETE /v1/files/{id}``."""

    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


ItemT = TypeVar("ItemT")


class ListPage(WireModel, Generic[ItemT]):
    """The list envelope of ``GET /v1/batches`` and ``GET /v1/files``."""

    object: Literal["list"] = "list"
    data: list[ItemT]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class ErrorBody(WireModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(WireModel):
    """``{"error": {"message", "type", "param", "code"}}`` — every HTTP error the gateway sends."""

    error: ErrorBody
