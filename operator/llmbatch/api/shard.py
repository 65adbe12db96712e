"""The shard spec: everything one executor run needs, written by the operator (or `llmbatch run`).

The contract between the operator (writer) and the executor (reader); it lives in ``api`` so
neither has to import the other.

Passed to ``python -m llmbatch.executor --shard-spec SOURCE`` where SOURCE is a local JSON file,
inline JSON (starts with ``{``), ``-`` (stdin), or ``<store-uri>#<key>`` (an object in a store).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmbatch.api.openai import Endpoint
from llmbatch.api.resources import Tier
from llmbatch.api.resources.pool import DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_IMAGES_PER_REQUEST

EngineName = Literal["vllm", "simulated"]

CHANNEL_MODEL_CONFIG = ConfigDict(extra="ignore")
"""The configuration of every message between operator and executor (this shard spec and the
slot channel, ``llmbatch.api.slot``): unknown fields are ignored, so an operator one version
ahead of an executor image, or behind it, still understands it. The rule that makes this safe
(docs/upgrading.md): a field is never removed or given another meaning, and a new field has a
default that means what an older peer does without it."""


class ModelRef(BaseModel):
    """The model to serve: the name requests use and where its weights are."""

    model_config = CHANNEL_MODEL_CONFIG

    name: str = Field(description="Served model name; request bodies' `model` must match it.")
    path: str = Field(description="Local folder (or file) of the weights, as the engine loads it.")
    aliases: list[str] = Field(
        default_factory=list, description="Further names requests may use for the same model."
    )
    revision: str | None = Field(
        default=None,
        description="The pinned revision of the weights (a ref or commit of a Hugging Face cache "
        "repository at `path`, or what its REVISION file declares); the slot does not start on "
        "other weights (executor/revision.py).",
    )


class RemoteMedia(BaseModel):
    """How the executor fetches an http(s) image or audio URL itself, before the engine sees
    the request (the engine then gets the bytes as a ``data:`` URL and never fetches)."""

    model_config = CHANNEL_MODEL_CONFIG

    max_bytes: int = Field(
        default=20 * 1024 * 1024, ge=1, description="Most bytes one fetched file may have."
    )
    timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="Time one fetch may take, redirects included."
    )
    max_redirects: int = Field(
        default=3, ge=0, le=10, description="Redirects followed, each hop checked again."
    )
    allowed_networks: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Non-public networks (CIDRs) fetches may reach; empty: public addresses "
        "only (never loopback, private, link-local, shared, metadata addresses).",
    )


class MediaLimits(BaseModel):
    """What the engine takes of a request's images (the pool's ``limits``), and whether the
    executor fetches remote media."""

    model_config = CHANNEL_MODEL_CONFIG

    max_image_pixels: int = Field(
        default=DEFAULT_MAX_IMAGE_PIXELS,
        ge=1,
        description="Most pixels of one image (vLLM's VLLM_MAX_IMAGE_PIXELS; a fetched image "
        "is checked too).",
    )
    max_images_per_request: int = Field(
        default=DEFAULT_MAX_IMAGES_PER_REQUEST,
        ge=0,
        description="Most images in one request (vLLM's limit_mm_per_prompt).",
    )
    remote: RemoteMedia | None = Field(
        default_factory=RemoteMedia,
        description="How the executor fetches http(s) media URLs (by default, as an older "
        "operator's spec means: fetched, guarded, with the default limits); null: they are "
        "refused (an error line). Never passed to the engine either way.",
    )


class EngineSpec(BaseModel):
    """Which engine runs the requests, and its arguments."""

    model_config = CHANNEL_MODEL_CONFIG

    name: EngineName = Field(description="`vllm` (production) or `simulated` (load tests only).")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="Engine arguments. vllm: vLLM engine args by their Python names "
        "(max_num_seqs, dtype, enforce_eager, max_model_len, ...). simulated: see "
        "llmbatch.executor.engines.simulated.SimulatedArgs.",
    )
    media: MediaLimits = Field(
        default_factory=MediaLimits,
        description="The image limits the engine applies, and how remote media is fetched.",
    )


class RequestRetries(BaseModel):
    """How the executor retries a request the engine answered with a transient error
    (``llmbatch.core.retries``: 5xx, 408, 429; never the caller's own 4xx)."""

    model_config = CHANNEL_MODEL_CONFIG

    max_attempts: int = Field(
        default=1,
        ge=1,
        le=20,
        description="Attempts of one request in all; 1 (an older operator's spec): no retry.",
    )
    backoff_seconds: float = Field(
        default=1.0, ge=0, le=600, description="Wait before the first retry; doubles after."
    )
    max_backoff_seconds: float = Field(
        default=30.0, ge=0, le=3600, description="The longest wait between two attempts."
    )


class ShardSpec(BaseModel):
    """One shard of one batch: a byte range of the input file and where its results go."""

    model_config = CHANNEL_MODEL_CONFIG

    batch_id: str = Field(description="OpenAI batch id (batch_...), for logs and messages.")
    batch_uid: str = Field(description="Batch uid: result-line ids derive from it.")
    shard_index: int = Field(default=0, ge=0)
    endpoint: Endpoint = Field(description="The endpoint every request of the shard calls.")
    tier: Tier = Field(
        default="standard",
        description="The batch's scheduling tier. Its requests carry the tier's engine priority "
        "(expedited ahead of standard ahead of flex), so on a slot shared by several shards an "
        "expedited shard's requests overtake the queued requests of lower tiers.",
    )

    cache_salt: str | None = Field(
        default=None,
        max_length=64,
        description="The engine's prefix-cache salt of the batch's tenant (vLLM `cache_salt`): "
        "requests of different tenants sharing one engine never share cached prefixes, so a "
        "cached-token count cannot tell one tenant what another sent. It replaces any salt a "
        "request line brings. None: no salt (a local run).",
    )

    store: str = Field(description="URI of the store results are written to (and read from).")
    input_store: str | None = Field(
        default=None, description="URI of the store holding the input; default: `store`."
    )
    input_key: str
    start: int = Field(default=0, ge=0, description="First byte of the shard's range.")
    end: int | None = Field(default=None, description="End (exclusive) of the range; None: EOF.")
    first_line: int = Field(default=1, ge=1, description="1-based line number of byte `start`.")

    output_prefix: str = Field(
        description="Key prefix of this shard's chunks and progress record (no trailing `/`)."
    )

    model: ModelRef
    engine: EngineSpec

    flush_lines: int = Field(default=1000, ge=1, description="Commit a chunk every N results...")
    flush_seconds: float = Field(default=10.0, gt=0, description="...or every T seconds.")
    max_in_flight: int | None = Field(
        default=None,
        ge=1,
        description="Requests handed to the engine at once; default 2 x max_num_seqs.",
    )
    watchdog_seconds: float = Field(
        default=600.0, gt=0, description="Engine counted hung after this long without a result."
    )
    drain_seconds: float = Field(
        default=10.0, ge=0, description="On SIGTERM, wait this long for in-flight requests."
    )
    cancel_drain_seconds: float | None = Field(
        default=None,
        ge=0,
        description="When the batch is cancelled (a cancel mark beside the shard's results), "
        "requests already in the engine get this long to finish; their results are committed. "
        "None (an older operator's spec): drain_seconds, as for any take-back.",
    )
    default_output_tokens: int | None = Field(
        default=None,
        ge=1,
        description="The output-token limit of a request that sets none (a Tokens pool that "
        "accepts such rows bills output tokens: its credit estimate reserved this many); None: "
        "the engine's own bound.",
    )
    retries: RequestRetries = Field(
        default_factory=RequestRetries,
        description="Per-request retries of transient engine errors.",
    )
    store_retry_seconds: float = Field(
        default=60.0,
        ge=0,
        description="Retry a failed chunk commit this long (with backoff) before the run ends "
        "with STORE_FAILED; the uncommitted results are kept until then, never dropped.",
    )

    @model_validator(mode="after")
    def _check(self) -> ShardSpec:
        if self.end is not None and self.end < self.start:
            raise ValueError(f"end ({self.end}) < start ({self.start})")
        self.output_prefix = self.output_prefix.rstrip("/")
        if not self.output_prefix:
            raise ValueError("output_prefix is empty")
        return self

    @property
    def input_store_uri(self) -> str:
        return self.input_store or self.store

    def served_names(self) -> list[str]:
        names = [self.model.name, *self.model.aliases]
        return list(dict.fromkeys(names))
