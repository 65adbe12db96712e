"""Custom resources of group ``llmbatch.io/v1alpha1``: Batch, BatchFile, BatchPool, CreditAccount.

These models are the single source of truth: ``hack/gen_crds.py`` turns them into the CRDs in
``crds/`` and the Helm chart, and every attribute docstring becomes the field's description that
``kubectl explain`` shows. Shape rules (checked by tests/unit/test_crd_shape.py): every string and
list is bounded, no floats (decimals are strings), no free-form maps except ``metadata``,
``nodeSelector`` and an inline request ``body``.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

GROUP = "llmbatch.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Bounded string types (Kubernetes-style limits).
DNSName = Annotated[str, StringConstraints(max_length=253)]
Label = Annotated[str, StringConstraints(max_length=63)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Text = Annotated[str, StringConstraints(max_length=4096)]
ObjectID = Annotated[str, StringConstraints(max_length=128)]
StoreKey = Annotated[str, StringConstraints(max_length=1024)]
Decimal = Annotated[str, StringConstraints(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$")]
"""A non-negative decimal number written as a string (CRDs carry no floats)."""
SignedDecimal = Annotated[str, StringConstraints(max_length=33, pattern=r"^-?[0-9]+(\.[0-9]+)?$")]
"""A decimal number that may be negative, written as a string."""
Sha256 = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
Quantity = Annotated[str, StringConstraints(max_length=64)]

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
Tier = Literal["expedited", "standard", "flex"]
"""Scheduling tier: expedited before standard before flex."""
EndpointPath = Literal["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]


class CRModel(BaseModel):
    """Base of every custom-resource model: camelCase on the wire, docstrings as descriptions."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        extra="ignore",
    )

    def to_k8s(self) -> dict[str, Any]:
        """The camelCase dict the Kubernetes API takes (unset optional fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(CRModel):
    """A standard Kubernetes condition."""

    type: Label
    """Condition type, e.g. Validated, Running, Finalized, Ready."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""
    """One CamelCase word saying why."""
    message: Annotated[str, StringConstraints(max_length=32768)] = ""
    """Human-readable details."""
    last_transition_time: Annotated[str, StringConstraints(max_length=64)] | None = None
    """When the status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The metadata.generation this condition was computed for."""


Conditions = Annotated[list[Condition], Field(max_length=16)]


# --- Batch ------------------------------------------------------------------------------------


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


class BatchSpec(CRModel):
    """What the user asked for. Everything but cancel is immutable after creation."""

    endpoint: EndpointPath
    """The API every request in the batch calls."""
    input_file_id: ObjectID | None = Field(default=None, alias="inputFileID")
    """Id of the BatchFile (purpose batch) with the requests; exactly one of this and requests."""
    requests: Annotated[list[InlineRequest], Field(max_length=1000)] | None = None
    """Requests given inline; exactly one of this and inputFileID."""
    completion_window: Annotated[
        str, StringConstraints(max_length=8, pattern=r"^[1-9][0-9]{0,5}[smh]$")
    ] = "24h"
    """Time budget: 24h through the OpenAI API; kubectl users may give seconds or minutes."""
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
    """Set to true to cancel: running requests stop, finished results are kept."""

    immutable: ClassVar[tuple[str, ...]] = (
        "endpoint",
        "input_file_id",
        "requests",
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
    """One shard: a byte range of the input run by one Job."""

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
    """Pending (queued), Admitted (Job unsuspended), Running, Succeeded, Failed, Stopped."""
    job: DNSName | None = None
    """Name of the shard's Job."""
    completed: int = 0
    """Requests of this shard in output chunks."""
    failed: int = 0
    """Requests of this shard in error chunks."""
    preemptions: int = 0
    """Times this shard was suspended for higher-priority work."""
    run_seconds: int = 0
    """Seconds the shard's pod held its slot in finished runs (GPU time billing)."""
    running_since: int | None = None
    """Unix seconds the current run started, while one is under way."""
    message: Text | None = None
    """Why the shard failed, when it did."""
    reruns: int = 0
    """Times the operator re-ran the shard because its Job succeeded without a result for every
    request of the range (a broken executor invariant; each run gets its own Job)."""


class Pricing(CRModel):
    """Price per one million tokens, fixed on the batch at acceptance."""

    currency: Annotated[str, StringConstraints(max_length=8)] = "USD"
    """ISO currency code."""
    input_per_million: Decimal = "0"
    """Price of 1M input tokens."""
    output_per_million: Decimal = "0"
    """Price of 1M output tokens."""


BillingMode = Literal["Tokens", "GPUTime"]
"""Tokens: catalog pool, token prices per tier. GPUTime: private deployment, billed GPU time."""


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
    """The shard plan and each shard's state."""
    pricing: Pricing | None = None
    """Token prices fixed at acceptance for the batch's tier."""
    cost: Decimal | None = None
    """Cost of the successful requests at the fixed prices (GPU time on a private pool)."""
    billing: BatchBilling | None = None
    """Credit reservation and charge of the batch."""
    conditions: Conditions | None = None
    """Lifecycle conditions."""
    observed_generation: int | None = None
    """The metadata.generation last acted on."""
    work_removed_at: int | None = None
    """Unix seconds: retention removed the work area (shard specs, chunks, progress)."""


# --- BatchFile --------------------------------------------------------------------------------


class BatchFileSpec(CRModel):
    """Metadata of a stored file; the bytes live in the object store."""

    id: ObjectID
    """OpenAI file id, file-<32 hex>."""
    bytes: int
    """Size in bytes."""
    filename: Annotated[str, StringConstraints(max_length=512)]
    """The name the client gave (never used as a storage key)."""
    purpose: Literal["batch", "batch_output"]
    """batch for inputs, batch_output for output and error files."""
    sha256: Sha256 | None = None
    """SHA-256 of the bytes."""
    line_count: int | None = None
    """Requests in the file (inputs)."""
    model: ShortText | None = None
    """The model every request names (inputs)."""
    output_token_limits: int | None = None
    """Sum of the output-token limits the requests declare (inputs; for credit estimates)."""
    requests_without_output_limit: int | None = None
    """Requests that declare no output-token limit (inputs; the pool default is assumed)."""
    storage_key: StoreKey
    """Key of the bytes in the object store, derived from the id."""
    created_at: int
    """Unix seconds: upload or creation."""
    expires_at: int | None = None
    """Unix seconds: expiry set at creation; an input may ask for less than the 24 h default."""


class BatchFileStatus(CRModel):
    """Observed state of a file."""

    status: Literal["uploaded", "processed", "error"] = "processed"
    """OpenAI file status."""
    used_by: Annotated[list[ObjectID], Field(max_length=64)] | None = None
    """Batches that reference this file (retention keeps it while any runs)."""
    expires_at: int | None = None
    """Unix seconds: when retention plans to delete the file (the File object's expires_at)."""
    conditions: Conditions | None = None
    """Conditions."""


# --- BatchPool --------------------------------------------------------------------------------


class PoolModel(CRModel):
    """One model a pool serves."""

    name: ShortText
    """The model id clients put in body.model."""
    source: Annotated[str, StringConstraints(max_length=1024)]
    """Where the executor loads it: a path in the image/model cache, or a registry name."""
    revision: ShortText | None = None
    """Pinned revision (commit or tag) of the weights."""
    runner: Literal["generate", "pooling"] = "generate"
    """generate for chat/completions, pooling for embeddings."""


class Toleration(CRModel):
    """A pod toleration (as in core/v1)."""

    key: ShortText | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: ShortText | None = None
    """Taint value for Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated."""


class EnvVar(CRModel):
    """An environment variable of shard pods (plain values only; secrets via storeSecretName)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    """Variable name."""
    value: Annotated[str, StringConstraints(max_length=4096)] = ""
    """Variable value."""


class ModelCache(CRModel):
    """A PersistentVolumeClaim with model weights, mounted into every shard pod of the pool."""

    claim_name: DNSName
    """Name of the PersistentVolumeClaim in the pool's worker namespace."""
    mount_path: Annotated[str, StringConstraints(pattern=r"^/", max_length=512)] = "/models"
    """Where the weights appear in the pod; point the model sources below it."""
    read_only: bool = True
    """Mount read-only (ReadOnlyMany claims shared by every slot)."""


class ExecutorSpec(CRModel):
    """How shard pods run."""

    image: Annotated[str, StringConstraints(max_length=512)] = (
        "ghcr.io/llm-batch-operator/llm-batch-executor:0.1.0"
    )
    """Executor container image."""
    engine: Literal["vllm", "simulated"] = "vllm"
    """vllm in production; simulated only for control-plane load tests."""
    engine_args: Annotated[list[ShortText], Field(max_length=64)] | None = None
    """Extra vLLM engine arguments, e.g. --max-num-seqs=64."""
    env: Annotated[list[EnvVar], Field(max_length=64)] | None = None
    """Extra environment of shard pods, e.g. VLLM_CPU_KVCACHE_SPACE."""
    cpu: Quantity | None = None
    """CPU request and limit of a shard pod."""
    memory: Quantity | None = None
    """Memory request and limit of a shard pod."""
    model_cache: ModelCache | None = None
    """Volume holding the model weights (no download at pod start)."""
    shm_size: Quantity | None = None
    """Size of a memory-backed /dev/shm (vLLM's tensor-parallel workers need more than 64Mi)."""
    flush_lines: Annotated[int, Field(ge=1, le=100000)] = 1000
    """An executor commits a result chunk every this many results..."""
    flush_seconds: Annotated[int, Field(ge=1, le=3600)] = 10
    """...or this many seconds, whichever comes first (progress moves with the chunks)."""
    backoff_limit: Annotated[int, Field(ge=0, le=20)] = 3
    """Failed attempts (not counting preemptions) before a shard is given up."""
    termination_grace_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    """Time a shard pod gets to flush after SIGTERM."""
    service_account_name: DNSName | None = None
    """ServiceAccount of shard pods (no token is mounted)."""
    store_secret_name: DNSName | None = None
    """Secret in the worker namespace with object-store credentials."""


class TierSettings(CRModel):
    """Per-tier scheduling and price."""

    drain_target_seconds: Annotated[int, Field(ge=1)]
    """How soon the tier's backlog should be drained; sets desired slots."""
    pricing: Pricing = Field(default_factory=Pricing)
    """Price per 1M tokens for this tier."""


class PoolLimits(CRModel):
    """Per-batch limits, checked by the gateway at creation and again at validation."""

    max_requests: Annotated[int, Field(ge=1, le=50000)] | None = None
    """Most requests in one batch; default 1000, or 95 on a private (GPUTime) pool."""
    max_bytes: Annotated[int, Field(ge=1, le=268435456)] = 268435456
    """Largest input file in bytes (default 256 MiB)."""
    max_line_bytes: Annotated[int, Field(ge=1024, le=67108864)] = 8388608
    """Largest input line in bytes."""
    require_output_token_limit: bool = False
    """Every request must set max_tokens or max_completion_tokens."""
    max_queued_requests: Annotated[int, Field(ge=1)] | None = None
    """Most requests waiting in the pool's queue before new batches are refused (429)."""


def _default_tiers() -> dict[str, TierSettings]:
    return {
        "expedited": TierSettings(drain_target_seconds=600),
        "standard": TierSettings(drain_target_seconds=43200),
        "flex": TierSettings(drain_target_seconds=172800),
    }


class PoolTiers(CRModel):
    """Settings of each tier."""

    expedited: TierSettings = Field(default_factory=lambda: _default_tiers()["expedited"])
    """Expedited: tightest drain target, online price."""
    standard: TierSettings = Field(default_factory=lambda: _default_tiers()["standard"])
    """Standard: the batch price."""
    flex: TierSettings = Field(default_factory=lambda: _default_tiers()["flex"])
    """Flex: lowest priority and price, 72h window."""


class PoolBilling(CRModel):
    """How batches on this pool are charged against their tenant's CreditAccount."""

    mode: BillingMode = "Tokens"
    """Tokens: catalog, successful results at token prices; GPUTime: private, GPU time billed."""
    gpu_hour_price: Decimal = "0"
    """Price of one GPU-hour in GPUTime mode (a slot holds gpusPerSlot GPUs)."""
    default_output_tokens: Annotated[int, Field(ge=1, le=1048576)] = 1024
    """Output tokens assumed, when estimating credit, for a request without an output limit."""


class PoolRetention(CRModel):
    """File retention of the pool's batches; nothing a running batch references is ever deleted."""

    accepted_input_seconds: Annotated[int, Field(ge=1, le=2592000)] | None = None
    """Most seconds an input file is kept after a batch accepted it (default 48 h)."""
    input_after_batch_seconds: Annotated[int, Field(ge=0, le=2592000)] | None = None
    """Seconds an accepted input is kept after its last batch finished (default 0)."""
    output_seconds: Annotated[int, Field(ge=1, le=2592000)] | None = None
    """Lifetime of output and error files unless the batch sets one (default 7 days)."""


class BatchPoolSpec(CRModel):
    """One served model (or a few) on one kind of GPU node."""

    models: Annotated[list[PoolModel], Field(min_length=1, max_length=16)]
    """Models the pool serves."""
    worker_namespace: DNSName = "llmbatch-workers"
    """Namespace the shard Jobs run in."""
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    """How shard pods run."""
    gpus_per_slot: Annotated[int, Field(ge=0, le=16)] = 1
    """nvidia.com/gpu requested by one slot (shard pod)."""
    node_selector: dict[Label, ShortText] | None = None
    """Node labels shard pods must match."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] | None = None
    """Tolerations of shard pods."""
    min_slots: Annotated[int, Field(ge=0, le=1024)] = 0
    """Fewest slots kept even without work."""
    max_slots: Annotated[int, Field(ge=1, le=1024)] = 1
    """Most shard Jobs running at once."""
    shard_requests: Annotated[int, Field(ge=1, le=50000)] = 1000
    """Target requests per shard."""
    throughput_per_slot: Decimal = "1"
    """Requests per second one slot is expected to finish (learned as shards finish)."""
    limits: PoolLimits = Field(default_factory=PoolLimits)
    """Per-batch limits."""
    tiers: PoolTiers = Field(default_factory=PoolTiers)
    """Drain targets and prices per tier."""
    billing: PoolBilling = Field(default_factory=PoolBilling)
    """Billing mode (token prices or GPU time) and credit-estimate defaults."""
    expedited_allowed: bool = True
    """Whether this pool accepts expedited batches."""
    preemption: Literal["Never", "LowerPriority"] = "Never"
    """LowerPriority lets expedited shards suspend running standard/flex shards."""
    max_preemptions_per_shard: Annotated[int, Field(ge=0, le=100)] = 3
    """A shard is not preempted more often than this."""
    scale_down_cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """How long the wanted slot count must stay lower before slots are released."""
    retention: PoolRetention | None = None
    """How long files of batches on this pool are kept; unset: LLMBATCH_RETENTION_* defaults."""


class QueueDepth(CRModel):
    """Pending requests per tier."""

    expedited: int = 0
    """Expedited requests waiting or running."""
    standard: int = 0
    """Standard requests waiting or running."""
    flex: int = 0
    """Flex requests waiting or running."""


class BatchPoolStatus(CRModel):
    """Observed state of a pool."""

    slots_in_use: int = 0
    """Shard Jobs unsuspended now."""
    desired_slots: int = 0
    """Slots the autoscaler wants."""
    queue_depth: QueueDepth | None = None
    """Backlog per tier."""
    throughput_per_slot: Decimal | None = None
    """Learned requests per second per slot."""
    scale_down_since: int | None = None
    """Unix seconds since the autoscaler has wanted fewer slots (scale-down cool-down)."""
    conditions: Conditions | None = None
    """Conditions."""
    observed_generation: int | None = None
    """The metadata.generation last acted on."""


# --- CreditAccount ----------------------------------------------------------------------------

CREDIT_ACCOUNT_NAME = "default"
"""A tenant's one CreditAccount: ``creditaccounts/default`` in its namespace."""


class CreditAccountSpec(CRModel):
    """The credit a tenant may spend; raise the limit to top it up."""

    limit: Decimal
    """Total credit granted, in currency units; spending stops when reserved + charged reach it."""
    currency: Annotated[str, StringConstraints(max_length=8)] = "USD"
    """ISO currency code (the pools' prices are in this currency)."""


class CreditReservation(CRModel):
    """Credit held for one batch from acceptance until it ends."""

    batch: DNSName
    """Name of the Batch (in the account's namespace)."""
    amount: Decimal
    """Credit held: the estimated cost."""
    estimated_tokens: int = 0
    """Input plus output tokens the estimate assumed."""
    pool: DNSName | None = None
    """The pool whose prices were used."""
    mode: BillingMode = "Tokens"
    """How the batch will be charged."""
    pricing: Pricing | None = None
    """Token prices of the batch's tier, fixed at acceptance (Tokens mode)."""
    gpu_hour_price: Decimal | None = None
    """GPU-hour price fixed at acceptance (GPUTime mode)."""
    created_at: int
    """Unix seconds: when the credit was reserved."""


class CreditAccountStatus(CRModel):
    """Spend of the tenant, kept by the gateway and the operator with atomic updates."""

    reserved: Decimal = "0"
    """Credit held by unfinished batches (the sum of reservations)."""
    charged: Decimal = "0"
    """Credit spent by finished batches, ever."""
    available: SignedDecimal | None = None
    """limit - reserved - charged (negative when actual costs passed the estimates)."""
    active_batches: int = 0
    """Batches holding a reservation."""
    reservations: Annotated[list[CreditReservation], Field(max_length=1000)] | None = None
    """One entry per unfinished batch; a batch is charged once, when its entry is removed."""
    conditions: Conditions | None = None
    """Conditions."""


# --- resource registry ------------------------------------------------------------------------


class ResourceKind(BaseModel):
    """What the generator needs to know about one kind."""

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    scope: Literal["Namespaced", "Cluster"]
    spec: type[CRModel]
    status: type[CRModel]
    description: str
    printer_columns: list[dict[str, str]]
    rules: list[dict[str, str]] = []
    """CEL rules on the whole object (x-kubernetes-validations of the root schema)."""


RESOURCES: tuple[ResourceKind, ...] = (
    ResourceKind(
        kind="Batch",
        plural="batches",
        singular="batch",
        short_names=["lbatch"],
        scope="Namespaced",
        spec=BatchSpec,
        status=BatchStatus,
        description=(
            "An OpenAI-compatible batch of inference requests; its namespace is the tenant."
        ),
        printer_columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.status"},
            {"name": "Completed", "type": "integer", "jsonPath": ".status.requestCounts.completed"},
            {"name": "Failed", "type": "integer", "jsonPath": ".status.requestCounts.failed"},
            {"name": "Total", "type": "integer", "jsonPath": ".status.requestCounts.total"},
            {"name": "Priority", "type": "string", "jsonPath": ".spec.priority"},
            {"name": "Model", "type": "string", "jsonPath": ".status.model", "priority": "1"},
            {"name": "Cost", "type": "string", "jsonPath": ".status.cost", "priority": "1"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        rules=[
            {
                "rule": "self.metadata.name.startsWith('batch-')",
                "message": "a Batch name starts with batch- (its OpenAI id is batch_<rest>)",
            }
        ],
    ),
    ResourceKind(
        kind="BatchFile",
        plural="batchfiles",
        singular="batchfile",
        short_names=["lbfile"],
        scope="Namespaced",
        spec=BatchFileSpec,
        status=BatchFileStatus,
        description="Metadata of a file in the object store (batch input, output or errors).",
        printer_columns=[
            {"name": "Purpose", "type": "string", "jsonPath": ".spec.purpose"},
            {"name": "Bytes", "type": "integer", "jsonPath": ".spec.bytes"},
            {"name": "Filename", "type": "string", "jsonPath": ".spec.filename"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    ),
    ResourceKind(
        kind="BatchPool",
        plural="batchpools",
        singular="batchpool",
        short_names=["lbpool"],
        scope="Cluster",
        spec=BatchPoolSpec,
        status=BatchPoolStatus,
        description="A pool of GPU slots serving one or more models to batches.",
        printer_columns=[
            {"name": "Model", "type": "string", "jsonPath": ".spec.models[0].name"},
            {"name": "Slots", "type": "integer", "jsonPath": ".status.slotsInUse"},
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredSlots"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.maxSlots"},
            {"name": "Expedited", "type": "integer", "jsonPath": ".status.queueDepth.expedited"},
            {"name": "Standard", "type": "integer", "jsonPath": ".status.queueDepth.standard"},
            {"name": "Flex", "type": "integer", "jsonPath": ".status.queueDepth.flex"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    ),
    ResourceKind(
        kind="CreditAccount",
        plural="creditaccounts",
        singular="creditaccount",
        short_names=["lbcredit"],
        scope="Namespaced",
        spec=CreditAccountSpec,
        status=CreditAccountStatus,
        description=(
            "A tenant's credit: its limit, the credit reserved by unfinished batches and what "
            "finished batches were charged. One per tenant namespace, named default."
        ),
        printer_columns=[
            {"name": "Limit", "type": "string", "jsonPath": ".spec.limit"},
            {"name": "Reserved", "type": "string", "jsonPath": ".status.reserved"},
            {"name": "Charged", "type": "string", "jsonPath": ".status.charged"},
            {"name": "Available", "type": "string", "jsonPath": ".status.available"},
            {"name": "Batches", "type": "integer", "jsonPath": ".status.activeBatches"},
            {"name": "Currency", "type": "string", "jsonPath": ".spec.currency", "priority": "1"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        rules=[
            {
                "rule": f"self.metadata.name == '{CREDIT_ACCOUNT_NAME}'",
                "message": f"a tenant has one CreditAccount, named {CREDIT_ACCOUNT_NAME}",
            }
        ],
    ),
)
