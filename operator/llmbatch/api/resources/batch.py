"""The Batch resource: an OpenAI batch, its spec (immutable but cancel) and its status."""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints

from llmbatch.api.openai import Endpoint
from llmbatch.api.resources.base import Conditions, CRModel, Pricing
from llmbatch.api.resources.fields import (
    BillingMode,
    Decimal,
    DNSName,
    Label,
    ObjectID,
    Sha256,
    ShortText,
    StoreKey,
    Text,
    Tier,
)

#: The operator's finalizer on a Batch: its Jobs, shards and work area are cleaned up before
#: the object goes. The gateway puts it on at create (no extra write per batch); the operator
#: adds it to a Batch created without it (kubectl). Not kopf's finalizer: batches have no kopf
#: changing handlers, so kopf writes nothing on them (docs/architecture.md).
BATCH_FINALIZER = "llmbatch.io/cleanup"

#: The longest completion window a Batch may ask for: the flex tier's 72 h, the longest any tier
#: gets (the CRD refuses a longer one, the operator fails one created before that rule).
MAX_COMPLETION_WINDOW = "72h"


class Phase(enum.StrEnum):
    """The OpenAI batch statuses, the lifecycle of a Batch (docs/architecture.md)."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class BatchConditionType(enum.StrEnum):
    """The condition types the operator sets on a Batch (``status.conditions``).

    ``Complete`` and ``Failed`` are the Job controller's: ``kubectl wait
    --for=condition=Complete`` returns when a batch completed, ``--for=condition=Failed`` when it
    failed, expired or was cancelled. ``Reconciling`` and ``Stalled`` are the kstatus conditions
    that Flux, Argo CD and ``kpt`` read: a running batch is in progress, a failed one failed, a
    completed one current."""

    RECONCILING = "Reconciling"
    """True while the batch is validating, in progress, finalizing or cancelling; False once it
    ended."""
    COMPLETE = "Complete"
    """True once the batch completed (its requests ran; some may have failed)."""
    FAILED = "Failed"
    """True once the batch failed, expired or was cancelled; the reason says which."""
    STALLED = "Stalled"
    """True with ``Failed``, with the same reason (kstatus: the batch will not complete)."""
    EXPIRED = "Expired"
    """True from when the completion window passed with requests not yet run (the batch then
    finalizes and ends expired)."""
    POOL_DELETED = "PoolDeleted"
    """True when the batch's BatchPool was deleted while it ran (the batch then ends failed)."""
    WEBHOOKS_DELIVERED = "WebhooksDelivered"
    """After the end, when the tenant has BatchWebhooks: whether every endpoint got the event."""


class BatchEndReason(enum.StrEnum):
    """Why a batch ended: the reason of its ``Complete`` or ``Failed`` condition."""

    COMPLETED = "Completed"
    """Every request ran (the error file holds those the model answered with an error)."""
    VALIDATION_FAILED = "ValidationFailed"
    """The input was refused before anything ran (``status.errors`` says why)."""
    EXPIRED = "Expired"
    """The completion window passed; requests that did not run are ``batch_expired`` lines."""
    CANCELLED = "Cancelled"
    """A cancel was asked for; requests that did not run are ``batch_cancelled`` lines."""
    POOL_DELETED = "PoolDeleted"
    """The batch's pool was deleted while it ran; requests that did not run are
    ``pool_deleted`` lines."""


BatchPhase = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
"""The values of :class:`Phase`, as the CRD schema lists them."""
EndpointPath = Endpoint
"""The endpoints a batch may call (``llmbatch.api.openai.Endpoint``)."""


class InlineRequest(CRModel):
    """One request given inline instead of an input file (same fields as an input line)."""

    custom_id: Annotated[str, StringConstraints(min_length=1, max_length=512)] = Field(
        alias="customID"
    )
    """The caller's id, unique within the batch."""
    method: Literal["POST"] = "POST"
    """HTTP method; always POST."""
    url: Annotated[str, StringConstraints(max_length=64)]
    """Endpoint path; must equal spec.endpoint."""
    body: dict[str, Any]
    """The request body, exactly as the endpoint takes it."""


class InlineInputRef(CRModel):
    """Inline requests the gateway wrote to the store when the batch was created, as an upload
    would: the Batch keeps a reference and the count, so it stays a few KB whatever it carries
    (listings, watches and etcd move the object, not its requests)."""

    key: StoreKey
    """Where the requests are, as JSONL (``inline/<namespace>/<batch id>.jsonl``)."""
    requests: Annotated[int, Field(ge=1, le=1000)]
    """How many requests it holds."""
    bytes: Annotated[int, Field(ge=0)]
    """Its size."""
    sha256: Sha256
    """Its SHA-256 (hex): the operator reads exactly what the gateway wrote."""


class BatchSpec(CRModel):
    """What the user asked for. Everything but cancel is immutable after creation."""

    endpoint: EndpointPath
    """The API every request in the batch calls."""
    input_file_id: ObjectID | None = Field(default=None, alias="inputFileID")
    """Id of the BatchFile (purpose batch) with the requests; one of three inputs."""
    requests: Annotated[list[InlineRequest], Field(max_length=1000)] | None = None
    """Requests given inline (kubectl); one of three inputs."""
    inline_input: InlineInputRef | None = Field(default=None, alias="inlineInput")
    """Inline requests the gateway stored at creation (POST with requests); one of three inputs."""
    completion_window: Annotated[
        str, StringConstraints(max_length=8, pattern=r"^[1-9][0-9]{0,5}[smh]$")
    ] = "24h"
    """Time budget: 24h through the OpenAI API; kubectl users may give seconds, minutes or
    hours, up to 72h."""
    priority: Tier = "standard"
    """Scheduling tier; expedited runs ahead of standard, flex last (metadata.tier=flex)."""
    model: ShortText | None = None
    """Display hint for the model; validation settles the real one from the input."""
    pool: DNSName | None = None
    """Name of the BatchPool to run on; by default the pool serving the model."""
    metadata: (
        Annotated[
            dict[str, Annotated[str, StringConstraints(max_length=512)]], Field(max_length=16)
        ]
        | None
    ) = None
    """Up to 16 key/value pairs echoed back; keys ≤ 64 characters, values ≤ 512."""
    output_expires_after_seconds: Annotated[int, Field(ge=3600, le=2592000)] | None = None
    """Lifetime of the output and error files after their creation (default: 7 days)."""
    cancel: bool = False
    """Set to true to cancel: no further request starts; requests already running finish (a
    request between retry attempts included) for up to the pool's executor.cancelDrainSeconds
    (600 s by default) and are kept and billed with the finished ones; every request that did
    not run becomes a batch_cancelled error line. The batch then reads cancelled."""

    immutable: ClassVar[tuple[str, ...]] = (
        "endpoint",
        "input_file_id",
        "requests",
        "inline_input",
        "completion_window",
        "priority",
        "pool",
        "metadata",
        "output_expires_after_seconds",
    )


class RequestCounts(CRModel):
    """Request counts; completed + failed == total once the batch is terminal."""

    total: int = 0
    """Requests in the input."""
    completed: int = 0
    """Requests with a line in the output file."""
    failed: int = 0
    """Requests with a line in the error file."""


class Usage(CRModel):
    """Token usage of the successful requests (what is billed)."""

    input_tokens: int = 0
    """Prompt tokens."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""
    output_tokens: int = 0
    """Generated tokens."""
    reasoning_tokens: int = 0
    """Generated reasoning tokens."""
    total_tokens: int = 0
    """input + output tokens."""


class ValidationError(CRModel):
    """One problem found in the input (OpenAI errors.data item)."""

    code: Label
    """Stable error code, e.g. invalid_json_line."""
    message: Text
    """What is wrong."""
    param: ShortText | None = None
    """The offending field, when there is one."""
    line: int | None = None
    """1-based line of the input file."""


class ShardStatus(CRModel):
    """One shard: a byte range of the input, run on a warm slot of the pool."""

    index: int
    """Position of the shard in the plan."""
    start: int
    """First byte of the range."""
    end: int
    """Byte after the range."""
    first_line: int
    """Line number of the range's first line."""
    line_count: int
    """Physical lines in the range (blank ones included)."""
    request_count: int
    """Requests in the range."""
    phase: Literal["Pending", "Admitted", "Running", "Succeeded", "Failed", "Stopped"] = "Pending"
    """Pending (waiting for a slot), Running (on a slot), Succeeded, Failed (Admitted and
    Stopped: older operators' per-shard Jobs)."""
    job: DNSName | None = None
    """The slot (its Job's name) that runs or last ran the shard."""
    completed: int = 0
    """Requests of this shard in output chunks."""
    failed: int = 0
    """Requests of this shard in error chunks."""
    preemptions: int = 0
    """Times this shard was taken back from its slot for higher-priority work."""
    run_seconds: int = 0
    """The shard's share of its slots' busy time, rounded up (GPU time billing): while n
    requests are in an engine each accrues 1/n of the time; idle and queue time count for none."""
    running_since: int | None = None
    """Unused since warm slots (older operators: when the current run started)."""
    message: Text | None = None
    """Why the shard failed, when it did."""
    reruns: int = 0
    """Runs of the shard that ended early (engine or store failure, a lost slot, or a run that
    said done without a result for every request); the shard fails after the pool's
    executor.backoffLimit."""


class ShardPlanRef(CRModel):
    """A plan of more shards than the status lists (docs/architecture.md, "Lean objects"): every
    shard's byte range is one object in the store, and the status lists only the shards that
    run, failed or were re-queued, plus :class:`SucceededShards` for those that finished."""

    key: StoreKey
    """Store key of the plan (a JSON list of every shard's range)."""
    count: int
    """Shards in the plan (indexes 0 to count - 1)."""
    shard_requests: int
    """Requests of every shard but the last (the planner cuts shards of one size)."""
    last_requests: int
    """Requests of the last shard."""


class SucceededShards(CRModel):
    """The shards of a stored plan (:class:`ShardPlanRef`) that succeeded, folded out of the
    status's shard list (their results and progress are in the store)."""

    indexes: Annotated[str, StringConstraints(max_length=4096, pattern=r"^[0-9,-]*$")] = ""
    """Their indexes as ranges, e.g. ``0-57,60``."""
    count: int = 0
    """How many succeeded."""
    preemptions: int = 0
    """Times they were taken back for higher-priority work, together."""
    reruns: int = 0
    """Their runs that ended early, together."""


class BatchBilling(CRModel):
    """Credit held for the batch while it runs, and when its cost was charged (docs/billing.md)."""

    mode: BillingMode = "Tokens"
    """How the batch is charged, fixed at acceptance from its pool."""
    gpu_hour_price: Decimal | None = None
    """Price of one GPU-hour, fixed at acceptance (GPUTime mode)."""
    account: DNSName | None = None
    """The tenant's CreditAccount holding the reservation; absent: the tenant has no account."""
    estimated_tokens: int = 0
    """Input plus output tokens estimated at acceptance (the tenant's queued-token quota)."""
    reserved: Decimal = "0"
    """Credit reserved at acceptance; released when the batch ends."""
    gpu_seconds: int | None = None
    """GPU-seconds used by the shards (GPUTime mode), including work before a cancel."""
    settled_at: int | None = None
    """Unix seconds: the reservation was released and the cost charged (never twice)."""


class BatchStatus(CRModel):
    """The OpenAI Batch object's fields plus the operator's bookkeeping."""

    status: Phase | None = None
    """OpenAI status: validating, in_progress, finalizing, completed, failed, expired, ..."""
    model: ShortText | None = None
    """The model every request uses, settled by validation."""
    model_revision: ShortText | None = None
    """The revision of the model's weights pinned at acceptance (the pool model's ``revision``
    then); every shard of the batch runs it. None when the pool pinned none."""
    pool: DNSName | None = None
    """The BatchPool running the batch."""
    worker_namespace: DNSName | None = None
    """Where the batch's shard Jobs run (the pool's worker namespace at acceptance), so they are
    found and removed even after the pool is deleted."""
    gpus_per_slot: int | None = None
    """GPUs per shard pod of the pool at acceptance (GPU-time billing after a pool is gone)."""
    request_counts: RequestCounts | None = None
    """Request counts."""
    usage: Usage | None = None
    """Token usage of successful requests."""
    errors: Annotated[list[ValidationError], Field(max_length=100)] | None = None
    """Validation errors (first 100) when the input was rejected."""
    output_file_id: ObjectID | None = Field(default=None, alias="outputFileID")
    """Id of the BatchFile with successful results."""
    error_file_id: ObjectID | None = Field(default=None, alias="errorFileID")
    """Id of the BatchFile with failed requests."""
    input_key: StoreKey | None = None
    """Store key of the input the shards read."""
    input_bytes: int | None = None
    """Size of the input in bytes."""
    created_at: int | None = None
    """Unix seconds: creation."""
    in_progress_at: int | None = None
    """Unix seconds: validation passed."""
    expires_at: int | None = None
    """Unix seconds: end of the completion window."""
    finalizing_at: int | None = None
    """Unix seconds: finalizing started."""
    completed_at: int | None = None
    """Unix seconds: completed."""
    failed_at: int | None = None
    """Unix seconds: failed."""
    expired_at: int | None = None
    """Unix seconds: expired."""
    cancelling_at: int | None = None
    """Unix seconds: cancel requested."""
    cancelled_at: int | None = None
    """Unix seconds: cancelled."""
    shards: Annotated[list[ShardStatus], Field(max_length=1000)] | None = None
    """The shard plan and each shard's state; with a stored plan (``shardPlan``) only the
    shards that run, failed or were re-queued (a shard not listed and not succeeded waits)."""
    shard_plan: ShardPlanRef | None = None
    """Where a plan of more shards than the status lists is stored (None: ``shards`` lists
    every shard)."""
    succeeded_shards: SucceededShards | None = None
    """The shards of a stored plan that succeeded (no longer listed in ``shards``)."""
    pricing: Pricing | None = None
    """Token prices fixed at acceptance for the batch's tier."""
    cost: Decimal | None = None
    """Cost of the successful requests at the fixed prices (GPU time on a private pool)."""
    billing: BatchBilling | None = None
    """Credit reservation and charge of the batch."""
    conditions: Conditions | None = None
    """Lifecycle conditions. While the batch runs: ``Reconciling=True`` (reason: the last step,
    e.g. Accepted, Validated, ShardsFinished, CancelRequested). When it ends:
    ``Reconciling=False`` and, on completed, ``Complete=True`` (reason Completed); on failed,
    expired or cancelled, ``Failed=True`` and ``Stalled=True`` (reason ValidationFailed,
    PoolDeleted, Expired or Cancelled). ``Expired=True`` marks a window that passed while
    requests ran, ``PoolDeleted=True`` a pool deleted under the batch, ``WebhooksDelivered`` the
    delivery of the end's webhook events. There is no ``Ready`` condition: wait with ``kubectl
    wait --for=condition=Complete``."""
    observed_generation: int | None = None
    """The metadata.generation last acted on (kstatus: the status is current when it equals
    metadata.generation)."""
    work_removed_at: int | None = None
    """Unix seconds: retention removed the work area (shard specs, chunks, progress)."""
