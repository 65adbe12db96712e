"""The slot channel: how the operator hands shards to a warm slot and how the slot answers.

A slot is one long-lived executor process holding a pool's model. The operator writes, in the
object store, one :class:`Assignment` per shard the slot should run and a :class:`ShardLease`
beside each shard's results; the slot writes its :class:`SlotHeartbeat`. Every message is a
whole object replaced in place (idempotent): re-reading it, or writing it twice, changes
nothing. The executor never needs a Kubernetes client (docs/architecture.md, "Warm slots").

Keys (``llmbatch.core.keys``): ``slots/<pool>/<slot>/assignments/<batch-uid>-<shard>.json``,
``slots/<pool>/<slot>/heartbeat.json``, ``slots/<pool>/<slot>/drain`` and
``<shard prefix>/lease.json``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmbatch.api.shard import CHANNEL_MODEL_CONFIG, EngineSpec, ModelRef, ShardSpec

LeaseState = Literal["granted", "released", "done", "failed", "fenced"]
ShardState = Literal["running", "done", "preempted", "engine_failed", "store_failed", "lease_lost"]


class SlotSpec(BaseModel):
    """Everything a slot process needs before its first assignment (``--slot SOURCE``)."""

    model_config = CHANNEL_MODEL_CONFIG

    pool: str = Field(description="The BatchPool this slot serves.")
    slot: str = Field(description="The slot's name (its Job's name); unique in the pool.")
    store: str = Field(description="URI of the store that carries the slot channel.")
    channel_prefix: str = Field(description="Key prefix of this slot's channel (no trailing `/`).")
    model: ModelRef
    engine: EngineSpec
    concurrency: int | None = Field(
        default=1,
        ge=1,
        description="Shards run at once on the one engine (spec.slotConcurrency); null: sized "
        "from the loaded engine's max_num_seqs (one shard per 8 sequences, 1..8).",
    )
    idle_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Exit after this long with nothing assigned; 0: exit as soon as the slot "
        "has run its assignments and nothing new is assigned (the cold, one-shard slot).",
    )
    heartbeat_seconds: float = Field(
        default=5.0, gt=0, description="How often the slot renews its leases (its heartbeat)."
    )
    poll_seconds: float = Field(
        default=0.5, gt=0, description="How often the slot looks for new or revoked assignments."
    )


class ShardLease(BaseModel):
    """Where a shard stands in its pool: the placement record and fencing token.

    Written by the operator only: the pool scheduler grants and settles it, finalisation fences
    it (a last generation held by nobody). A runner checks the lease before each chunk commit
    and stops when the generation is no longer its own, so two runners never both go on writing
    one shard.
    """

    model_config = CHANNEL_MODEL_CONFIG

    generation: int = Field(ge=0, description="Raised on every grant (and when fenced).")
    slot: str = Field(default="", description="The slot holding the lease; empty when none.")
    ran_on: str = Field(
        default="",
        description="The slot that held the lease last, kept after the run ended (done, "
        "failed, released, fenced): the batch status names it even when it first reads the "
        "lease after the run. Never a fence: only `slot` and `generation` are.",
    )
    granted_at: float = Field(default=0.0, description="Unix seconds of the last grant.")
    state: LeaseState = Field(
        default="granted",
        description="granted: a slot runs it; released: back in the queue; done: every "
        "request has a result; failed: gave up (attempts exhausted); fenced: its batch is "
        "finishing and no slot runs it again.",
    )
    attempts: int = Field(
        default=0, ge=0, description="Runs that ended in a failure (engine, store, lost slot)."
    )
    preemptions: int = Field(default=0, ge=0, description="Times taken back for higher tiers.")
    crashes: int = Field(
        default=0,
        ge=0,
        description="Engine crashes with the shard's requests inside that were laid at those "
        "requests (no attempt counted; bounded by twice the attempts allowed).",
    )
    failed_slots: list[str] = Field(
        default_factory=list,
        description="The last slots that failed or were lost while running it (a shard under "
        "which two slots failed is given up).",
    )
    reason: str | None = Field(
        default=None,
        description="Why the last run ended early, as an Event reason: ShardIncomplete, "
        "EngineFailed, StoreFailed, SlotLost, SlotFailed.",
    )
    message: str | None = Field(default=None, description="Why the last run ended early.")


class Assignment(BaseModel):
    """One shard given to one slot under one lease generation."""

    model_config = CHANNEL_MODEL_CONFIG

    shard: ShardSpec
    lease_key: str | None = Field(
        default=None,
        description="Key of the shard's ShardLease object; None only for a shard run outside "
        "a pool (`llmbatch run`, `--shard-spec`), which nothing else can hold.",
    )
    generation: int = Field(
        default=0, ge=0, description="The lease generation this assignment runs under."
    )
    assigned_at: float = Field(default=0.0, description="Unix seconds (operator clock).")

    @property
    def key(self) -> str:
        """The assignment's name in the channel: ``<batch-uid>-<shard index>``."""
        return f"{self.shard.batch_uid}-{self.shard.shard_index:05d}"


class ShardReport(BaseModel):
    """What the slot says of one assignment in its heartbeat."""

    model_config = CHANNEL_MODEL_CONFIG

    key: str
    generation: int
    state: ShardState
    completed: int = 0
    failed: int = 0
    busy_seconds: float = Field(
        default=0.0,
        description="This run's share of the slot's busy time (while n requests are in the "
        "engine each accrues 1/n): what GPU-time billing charges (docs/billing.md).",
    )
    message: str | None = None
    counts_attempt: bool = Field(
        default=True,
        description="Whether a failed run counts as an attempt of the shard. False for an "
        "engine crash attributed to the requests in flight (recorded as suspects, run alone "
        "next time) and for one during which this shard had nothing in the engine.",
    )
    crash_suspects: int = Field(
        default=0,
        ge=0,
        description="Requests of this run that were in the engine when it crashed.",
    )
    media_in_flight: list[str] = Field(
        default_factory=list,
        description="The custom_ids of this run's requests with images or audio that are in "
        "the engine, or about to enter it: a request with media enters only once a heartbeat "
        "names it, so when the slot is killed for memory the operator knows which ones it may "
        "blame (core.oomblame).",
    )


class SlotHeartbeat(BaseModel):
    """The slot's state, rewritten every ``heartbeat_seconds``; a new ``seq`` renews its leases.

    The operator times liveness by its own clock (when it last saw ``seq`` change), so clock
    skew between nodes cannot expire or extend a lease.
    """

    model_config = CHANNEL_MODEL_CONFIG

    slot: str
    seq: int = Field(
        ge=0,
        description="Raised on every write (wall-clock milliseconds, so a restarted slot "
        "process never repeats one).",
    )
    state: Literal["starting", "ready", "draining", "exited"]
    engine_starts: int = Field(default=0, ge=0)
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Shards the slot runs at once, once its engine is loaded: the pool's "
        "slotConcurrency, or sized from the engine's own max_num_seqs.",
    )
    started_at: float = Field(description="Unix seconds the process started (slot clock).")
    ready_at: float | None = Field(default=None, description="When the engine was loaded.")
    busy_seconds: float = Field(
        default=0.0, description="Time with at least one request in the engine since start."
    )
    idle_seconds: float = Field(
        default=0.0, description="Time since ready with no request in the engine."
    )
    shards: list[ShardReport] = Field(default_factory=list)
    unreadable: list[str] = Field(
        default_factory=list,
        description="Assignments (by key) the slot could not parse: an operator of a newer "
        "version wrote something this executor cannot run (the operator reports it).",
    )
    exit_code: int | None = None
