"""Prometheus metrics of the operator (``/metrics``). No per-batch label, ever."""

from __future__ import annotations

from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from llmbatch.api.openai import BatchStatus

REGISTRY = CollectorRegistry(auto_describe=True)

BATCHES = Gauge(
    "llmbatch_batches",
    "Batches the operator knows, by OpenAI status.",
    ["status"],
    registry=REGISTRY,
)
BATCH_TRANSITIONS = Counter(
    "llmbatch_batch_transitions_total",
    "Batch status transitions, by the status entered.",
    ["status"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "llmbatch_requests_total",
    "Requests of finished batches, by outcome (completed or failed).",
    ["outcome"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "llmbatch_tokens_total",
    "Tokens of successful requests of finished batches, by direction (input or output).",
    ["direction"],
    registry=REGISTRY,
)
SHARD_INCOMPLETE = Counter(
    "llmbatch_shard_incomplete_total",
    "Shard Jobs that succeeded without a result for every request of their range (a broken "
    "executor invariant; the shard is re-run).",
    registry=REGISTRY,
)
SHARD_RUN_SECONDS = Histogram(
    "llmbatch_shard_run_seconds",
    "Wall time of finished shard Jobs, from start to completion.",
    ["pool"],
    buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200),
    registry=REGISTRY,
)
JOBS_RUNNING = Gauge(
    "llmbatch_pool_jobs_running",
    "Unsuspended, unfinished shard Jobs, by pool.",
    ["pool"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "llmbatch_pool_queue_depth_shards",
    "Shards waiting for a slot, by pool and tier.",
    ["pool", "tier"],
    registry=REGISTRY,
)
DESIRED_SLOTS = Gauge(
    "llmbatch_pool_desired_slots",
    "Slots the autoscaler wants, by pool.",
    ["pool"],
    registry=REGISTRY,
)
CREDITS_RESERVED = Counter(
    "llmbatch_credits_reserved_total",
    "Credit the operator itself reserved at acceptance (batches without a gateway reservation, "
    "and top-ups of short ones), in currency units; the gateway's reservations are "
    "llmbatch_gateway_credits_reserved_total. tenant is the namespace only when "
    "LLMBATCH_NAMESPACES bounds the tenants, else empty.",
    ["tenant"],
    registry=REGISTRY,
)
CREDITS_CHARGED = Counter(
    "llmbatch_credits_charged_total",
    "Credit charged for finished batches (reservation released), in currency units; tenant as "
    "for llmbatch_credits_reserved_total.",
    ["tenant"],
    registry=REGISTRY,
)
VALIDATION_SECONDS = Histogram(
    "llmbatch_validation_duration_seconds",
    "Time to validate and plan one batch input.",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
FINALIZE_SECONDS = Histogram(
    "llmbatch_finalize_duration_seconds",
    "Time to merge one batch's results into its output and error files.",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)

RETENTION_FILES_EXPIRED = Counter(
    "llmbatch_retention_files_expired_total",
    "Files retention deleted (bytes and BatchFile), by purpose (batch, batch_output).",
    ["purpose"],
    registry=REGISTRY,
)
RETENTION_FREED_BYTES = Counter(
    "llmbatch_retention_freed_bytes_total",
    "Bytes retention removed from the object store, by area (input, output, work).",
    ["area"],
    registry=REGISTRY,
)
RETENTION_SWEEP_SECONDS = Histogram(
    "llmbatch_retention_sweep_duration_seconds",
    "Time of one retention sweep over every BatchFile and finished Batch.",
    buckets=(0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
    registry=REGISTRY,
)
RETENTION_ERRORS = Counter(
    "llmbatch_retention_errors_total",
    "Retention deletions, status updates or whole sweeps that failed (the next sweep retries).",
    registry=REGISTRY,
)


_STATUSES: tuple[str, ...] = get_args(BatchStatus)
_known: dict[str, str] = {}


def observe_batch(uid: str, status: str | None) -> None:
    """Record a batch's current status for the ``llmbatch_batches`` gauge."""
    if status is None:
        _known.pop(uid, None)
    else:
        _known[uid] = status
    counts = dict.fromkeys(_STATUSES, 0)
    for value in _known.values():
        counts[value] = counts.get(value, 0) + 1
    for value, count in counts.items():
        BATCHES.labels(value).set(count)


def serve(port: int) -> None:
    """Expose /metrics on ``port`` (0: do nothing)."""
    if port:
        start_http_server(port, registry=REGISTRY)
