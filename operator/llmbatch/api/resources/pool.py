"""The BatchPool resource: GPU slots serving models, their executor, tiers, limits and billing."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from llmbatch.api.resources.base import Conditions, CRModel, Pricing
from llmbatch.api.resources.fields import (
    BillingMode,
    Decimal,
    DNSName,
    Label,
    Quantity,
    ShortText,
)
from llmbatch.api.resources.podtemplate import EnvVar, LabelSelector, PodTemplate, Toleration

Modality = Literal["text", "image", "audio"]
"""An input modality (``llmbatch.core.validation.media.MODALITIES``)."""
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
"""Pixels per image unless a pool says otherwise: 64 MiB decoded as RGBA."""
DEFAULT_MAX_IMAGES_PER_REQUEST = 16
"""Images per request unless a pool says otherwise: with the pixel cap at most 1 GiB of decoded
pixels per request, which a 24 GiB CPU slot decodes beside its model."""
DEFAULT_SLOT_MEMORY = "24Gi"
"""Memory request and limit of a slot pod unless its pool says otherwise: an out-of-memory kill
ends that slot's process, never the node's others."""


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
    input_modalities: Annotated[list[Modality], Field(min_length=1, max_length=3)] = Field(
        default_factory=lambda: list[Modality](["text"])
    )
    """What its requests may hold: a row with an image or audio part for a model that does not
    list it is refused with the line's number before it is queued (docs/validation.md)."""


class NamespaceSelector(LabelSelector):
    """Tenant namespaces by label (as a meta/v1 LabelSelector: every term must hold)."""


class PoolTenants(CRModel):
    """The tenants (namespaces) a pool serves: one listed, or one the selector matches."""

    namespaces: Annotated[list[DNSName], Field(max_length=256)] | None = None
    """Tenant namespaces served by name."""
    namespace_selector: NamespaceSelector | None = None
    """Tenant namespaces served by label (an empty selector matches every namespace)."""


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
    """Extra environment of slot pods, e.g. VLLM_CPU_KVCACHE_SPACE, or a token from a Secret
    (valueFrom)."""
    cpu: Quantity | None = None
    """CPU request and limit of a shard pod."""
    memory: Quantity | None = DEFAULT_SLOT_MEMORY
    """Memory request and limit of a slot pod (default 24Gi): an out-of-memory kill ends that
    slot, and a request with media in its engine then is blamed alone (docs/executor.md);
    null: no limit."""
    model_cache: ModelCache | None = None
    """Volume holding the model weights (no download at pod start)."""
    shm_size: Quantity | None = None
    """Size of a memory-backed /dev/shm (vLLM's tensor-parallel workers need more than 64Mi)."""
    flush_lines: Annotated[int, Field(ge=1, le=100000)] = 1000
    """An executor commits a result chunk every this many results..."""
    flush_seconds: Annotated[int, Field(ge=1, le=3600)] = 10
    """...or this many seconds, whichever comes first (progress moves with the chunks)."""
    backoff_limit: Annotated[int, Field(ge=0, le=20)] = 3
    """Failed runs of a shard (not counting preemptions, or engine crashes laid at its
    requests) before it is given up; a shard under which two slots failed is given up too."""
    termination_grace_seconds: Annotated[int, Field(ge=1, le=3600)] = 30
    """Time a slot pod gets to flush after SIGTERM."""
    cancel_drain_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    """When a batch is cancelled, its requests already in an engine get this long to finish
    (their results go into the output file and are billed); nothing new starts. The batch is
    cancelled once they are done or this has passed (OpenAI's cancelling lasts up to 10 min)."""
    service_account_name: DNSName | None = None
    """ServiceAccount of slot pods (no token is mounted)."""
    store_secret_name: DNSName | None = None
    """Secret in the worker namespace with object-store credentials."""
    pod_template: PodTemplate | None = None
    """Labels, annotations, affinity, topology spread, tolerations, a priority class and extra
    volumes of slot pods, merged under the fields the operator owns."""
    create_suspended: bool = False
    """Create slot Jobs with spec.suspend true, for an admission controller (Kueue) to resume
    when it admits them; a Job labelled kueue.x-k8s.io/queue-name is created suspended anyway.
    A suspended slot waits for admission: never removed for not starting."""


class PoolRetries(CRModel):
    """Per-request retries of transient engine errors (5xx, 408, 429; never the caller's own
    4xx): exponential backoff with jitter, a bounded number of attempts."""

    max_attempts: Annotated[int, Field(ge=1, le=20)] = 3
    """Attempts of one request in all, the first included; 1: never retried. A request that
    still fails says how many attempts it had in its error line's message."""
    backoff_milliseconds: Annotated[int, Field(ge=0, le=600000)] = 1000
    """Wait before the first retry; it doubles with each further one (half of it drawn at
    random, so requests that failed together do not come back together)..."""
    max_backoff_milliseconds: Annotated[int, Field(ge=0, le=3600000)] = 30000
    """...up to this."""


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
    require_output_token_limit: bool = True
    """Every request must set an output-token limit (chat: max_completion_tokens or max_tokens,
    completions: max_tokens). False accepts rows without one: on a Tokens
    pool they run with billing.defaultOutputTokens as their limit (what the estimate reserved),
    on a GPUTime pool with the engine's own."""
    max_queued_requests: Annotated[int, Field(ge=1)] | None = None
    """Most requests waiting in the pool's queue before new batches are refused (429)."""
    max_image_pixels: Annotated[int, Field(ge=1, le=268435456)] = DEFAULT_MAX_IMAGE_PIXELS
    """Most pixels (width x height, read from the image's header) of one image in a request:
    a larger one is refused with image_too_large before it is queued, and the engine refuses
    it too (a decompression bomb never reaches a decoder). Default 4096 x 4096."""
    max_images_per_request: Annotated[int, Field(ge=0, le=1000)] = DEFAULT_MAX_IMAGES_PER_REQUEST
    """Most images in one request (too_many_images); the engine's limit_mm_per_prompt too.
    With the pixel cap it bounds what one request can make a slot decode (default: 1 GiB)."""


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
    """Output tokens assumed, when estimating credit, for a request without an output limit;
    on a Tokens pool also the limit such a request runs with."""


class PoolRetention(CRModel):
    """File retention of the pool's batches; nothing a running batch references is ever deleted."""

    accepted_input_seconds: Annotated[int, Field(ge=1, le=2592000)] | None = None
    """Most seconds an input file is kept after a batch accepted it (default 48 h)."""
    input_after_batch_seconds: Annotated[int, Field(ge=0, le=2592000)] | None = None
    """Seconds an accepted input is kept after its last batch finished (default 0)."""
    output_seconds: Annotated[int, Field(ge=1, le=2592000)] | None = None
    """Lifetime of output and error files unless the batch sets one (default 7 days)."""
    batch_seconds: Annotated[int, Field(ge=0, le=31536000)] | None = None
    """Seconds a finished Batch object stays in the API server before it is archived in the
    store (still answered by the gateway); default: until its results expire."""


class TenantShareSettings(CRModel):
    """What the pool guarantees one named tenant (namespace)."""

    namespace: DNSName
    """The tenant's namespace."""
    min_seats: Annotated[int, Field(ge=0, le=65536)] = 0
    """Seats the tenant is served first, before any tenant's fair share (within a tier)."""
    max_seats: Annotated[int, Field(ge=0, le=65536)] | None = None
    """Most seats the tenant holds at once (a hard cap, even with seats idle); unset: none."""
    weight: Decimal | None = None
    """The tenant's weight in this pool (0.01-1000), over its namespace's
    llmbatch.io/fair-share-weight annotation; unset: the annotation's (default 1)."""


class FairSharing(CRModel):
    """How the pool shares its seats across tenants (namespaces)."""

    usage_half_life_seconds: Annotated[int, Field(ge=0, le=604800)] = 3600
    """Half-life of a tenant's remembered use (decayed seat-seconds): a tenant that used the
    pool heavily a moment ago yields to one that did not. 0: only the seats held now count."""
    tenants: Annotated[list[TenantShareSettings], Field(max_length=64)] = Field(
        default_factory=list
    )
    """Guarantees (minimum and maximum seats) and weights of named tenants."""
    preemption: Literal["Never", "BelowGuarantee"] = "Never"
    """BelowGuarantee: a waiting shard of a tenant below its minSeats (and its fair share) takes
    a running shard of a tenant above its fair share back from its slot (stop feeding, commit,
    re-queue); only while the victim keeps its share and guarantee. Needs slotQueue: 0."""


class BatchPoolSpec(CRModel):
    """One served model (or a few) on one kind of GPU node."""

    models: Annotated[list[PoolModel], Field(min_length=1, max_length=16)]
    """Models the pool serves."""
    worker_namespace: DNSName = "llmbatch-workers"
    """Namespace the slot Jobs run in."""
    executor: ExecutorSpec = Field(default_factory=ExecutorSpec)
    """How slot pods run."""
    retries: PoolRetries = Field(default_factory=PoolRetries)
    """Per-request retries of transient engine errors."""
    gpus_per_slot: Annotated[int, Field(ge=0, le=16)] = 1
    """nvidia.com/gpu requested by one slot (slot pod)."""
    node_selector: dict[Label, ShortText] | None = None
    """Node labels slot pods must match."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] | None = None
    """Tolerations of slot pods."""
    min_slots: Annotated[int, Field(ge=0, le=1024)] = 0
    """Slots kept warm: started before any work comes (for the first model) and kept up past
    idleSeconds; also the autoscaler's floor."""
    max_slots: Annotated[int, Field(ge=1, le=1024)] = 1
    """Most slots (slot Jobs) running at once."""
    slot_concurrency: Annotated[int, Field(ge=1, le=64)] | None = None
    """Shards one slot runs at once on its engine; unset: each slot sizes it from its loaded
    engine, max_num_seqs / 8 between 1 and 8."""
    slot_queue: Annotated[int, Field(ge=0, le=64)] | None = None
    """Shards a loaded slot holds queued beyond the ones it runs, to start the moment one of
    its seats frees instead of at the next scheduling round; only what no seat and no new slot
    takes queues, and a queued shard goes back to the pool when another slot has a seat free.
    Unset: as many as the slot runs at once; 0: no queue."""
    idle_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """A slot with nothing assigned exits after this long (scale to zero); 0: a slot exits as
    soon as its shards are done (a cold slot per burst of work)."""
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
    """LowerPriority lets waiting expedited shards take running standard/flex shards back from
    their slots (stop feeding, commit, re-queue)."""
    max_preemptions_per_shard: Annotated[int, Field(ge=0, le=100)] = 3
    """A shard is not taken back more often than this."""
    scale_down_cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """How long the wanted slot count must stay lower before slots are released."""
    retention: PoolRetention | None = None
    """How long files of batches on this pool are kept; unset: LLMBATCH_RETENTION_* defaults."""
    tenants: PoolTenants | None = None
    """The tenants this pool serves (a private deployment's owners); unset: every tenant.
    Others do not see its models in /v1/models and their batches for them are refused with
    model_not_found."""
    fair_sharing: FairSharing = Field(default_factory=FairSharing)
    """Shares of the pool's seats across tenants: remembered use, guarantees, preemption."""


class QueueDepth(CRModel):
    """Pending requests per tier."""

    expedited: int = 0
    """Expedited requests waiting or running."""
    standard: int = 0
    """Standard requests waiting or running."""
    flex: int = 0
    """Flex requests waiting or running."""


class TenantShare(CRModel):
    """One tenant's seats on the pool against its fair share."""

    namespace: DNSName
    """The tenant."""
    seats: int = 0
    """Seats it holds (shards running or queued on the pool's slots)."""
    share: Decimal = "0"
    """Its fair share of the pool's seats: its weight over those of the tenants with work."""
    weight: Decimal = "1"
    """Its weight in this pool."""
    waiting: int = 0
    """Its shards waiting for a seat."""
    usage_seat_seconds: int = 0
    """Its remembered use: decayed seat-seconds (fairSharing.usageHalfLifeSeconds)."""


class FairSharingStatus(CRModel):
    """The tenants of a pool, the busiest first (at most 20 listed)."""

    active_tenants: int = 0
    """Tenants with work waiting or running."""
    usage_at: int | None = None
    """Unix seconds the listed usage was computed at (an operator restart resumes from it)."""
    tenants: Annotated[list[TenantShare], Field(max_length=20)] = Field(default_factory=list)
    """Tenants with work or remembered use, by seats then usage (at most 20)."""


class BatchPoolStatus(CRModel):
    """Observed state of a pool."""

    slots_in_use: int = 0
    """Slots running at least one shard."""
    warm_slots: int = 0
    """Slots started and not draining: busy ones plus idle ones holding their model."""
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
    fair_sharing: FairSharingStatus | None = None
    """Seats in use against fair share, per tenant."""
