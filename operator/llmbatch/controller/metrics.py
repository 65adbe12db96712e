"""Prometheus metrics of the operator (``/metrics``). No per-batch label, ever."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from llmbatch.api.openai import BatchStatus
from llmbatch.buildinfo import build_labels
from llmbatch.core.tiers import TIERS
from llmbatch.storage import ObjectStore
from llmbatch.storage.instrumented import InstrumentedStore

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
BUILD_INFO = Gauge(
    "llmbatch_build_info",
    "Always 1: the operator's package version and the source revision it was built from.",
    ["version", "revision"],
    registry=REGISTRY,
)
BATCH_REQUESTS = Counter(
    "llmbatch_batch_requests_total",
    "Requests of finished batches, by outcome (completed or failed): the lines of their output "
    "and error files.",
    ["outcome"],
    registry=REGISTRY,
)
REQUESTS_DEPRECATED = Counter(
    "llmbatch_requests_total",
    "DEPRECATED, removed in the next release: use llmbatch_batch_requests_total (the same "
    "count, renamed so it is not taken for the gateway's HTTP requests).",
    ["outcome"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "llmbatch_tokens_total",
    "Tokens of successful requests of finished batches, by direction (input or output).",
    ["direction"],
    registry=REGISTRY,
)
EVENTS_DROPPED = Counter(
    "llmbatch_events_dropped_total",
    "Kubernetes Events of batches dropped unposted: the operator's queue of Events waiting to "
    "be posted was full (an API server refusing them for long).",
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "llmbatch_background_task_restarts_total",
    "Background tasks of the operator (the Event recorder, the reconcile workers, the retention "
    "and tenant sweeps, the credit upkeep, the webhook dispatcher) run again after they failed, "
    "by task.",
    ["task"],
    registry=REGISTRY,
)
SHARD_INCOMPLETE = Counter(
    "llmbatch_shard_incomplete_total",
    "Shard runs that ended done without a result for every request of their range (a broken "
    "executor invariant; the shard is re-run).",
    registry=REGISTRY,
)
SHARD_RUN_SECONDS = Histogram(
    "llmbatch_shard_run_seconds",
    "Wall time of finished shard runs on a slot, from assignment to done.",
    ["pool"],
    buckets=(10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200),
    registry=REGISTRY,
)
JOBS_RUNNING = Gauge(
    "llmbatch_pool_jobs_running",
    "Slots (slot Jobs) running at least one shard, by pool.",
    ["pool"],
    registry=REGISTRY,
)
WARM_SLOTS = Gauge(
    "llmbatch_pool_warm_slots",
    "Slots started and taking work (busy or idle with their model loaded), by pool.",
    ["pool"],
    registry=REGISTRY,
)
SLOT_STARTS = Counter(
    "llmbatch_slot_starts_total",
    "Slots started (each loads its model once), by pool.",
    ["pool"],
    registry=REGISTRY,
)
SLOT_ASSIGNMENTS = Counter(
    "llmbatch_slot_assignments_total",
    "Shards given to a slot (a re-run after a failure or preemption counts again), by pool.",
    ["pool"],
    registry=REGISTRY,
)
SLOT_ASSIGNMENT_WAIT = Histogram(
    "llmbatch_slot_assignment_wait_seconds",
    "Time from a batch starting to run to each of its shards' first assignment, by pool.",
    ["pool"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 900, 3600, 14400),
    registry=REGISTRY,
)
SLOT_QUEUE_RETURNS = Counter(
    "llmbatch_slot_queue_returns_total",
    "Shards queued on a slot and given back to the pool unstarted (a better tier took their "
    "place, or another slot had a seat free), by pool.",
    ["pool"],
    registry=REGISTRY,
)
SLOT_MESSAGES_UNREADABLE = Counter(
    "llmbatch_slot_messages_unreadable_total",
    "Slot-channel messages a pool round or a slot could not parse (a peer of another version "
    "wrote a field this side cannot read), by pool and reason: the message (heartbeat, lease, "
    "assignment). Each is skipped, never a crash; docs/upgrading.md has the rule.",
    ["pool", "reason"],
    registry=REGISTRY,
)
SLOTS_NOT_STARTED = Counter(
    "llmbatch_slots_not_started_total",
    "Slot Jobs removed because their pod sent no heartbeat within LLMBATCH_SLOT_START_SECONDS "
    "(an image that cannot be pulled, a missing Secret, a GPU request no node can meet), by "
    "pool. Their shards went back to the queue without an attempt.",
    ["pool"],
    registry=REGISTRY,
)
POOL_ROUND_SECONDS = Histogram(
    "llmbatch_pool_round_seconds",
    "Wall time of one pool scheduling round (settle ended runs, place the queue head), by pool: "
    "a seat freed by a finished shard waits up to one round interval plus this for its next "
    "shard.",
    ["pool"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
    registry=REGISTRY,
)
SLOT_SECONDS = Counter(
    "llmbatch_slot_seconds_total",
    "Slot time reported by slot heartbeats, by pool and status (busy: at least one request in "
    "the engine; idle: the model loaded and nothing to run). busy / (busy + idle) is the "
    "slots' busy fraction.",
    ["pool", "status"],
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
RETENTION_BATCHES_ARCHIVED = Counter(
    "llmbatch_retention_batches_archived_total",
    "Finished Batches moved from the API server to the archive in the store.",
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

TENANT_SWEEPS = Counter(
    "llmbatch_tenant_sweeps_total",
    "Deleted tenants (a namespace, by its UID) whose data the operator erased from the store "
    "once the grace period after the deletion ended.",
    registry=REGISTRY,
)
TENANT_SWEPT_BYTES = Counter(
    "llmbatch_tenant_swept_bytes_total",
    "Bytes of deleted tenants erased from the store, by area (archive, files, work, inline).",
    ["area"],
    registry=REGISTRY,
)
TENANTS_AWAITING_SWEEP = Gauge(
    "llmbatch_tenants_awaiting_sweep",
    "Deleted tenants whose data in the store waits for the end of the grace period.",
    registry=REGISTRY,
)

POOL_BACKLOG = Gauge(
    "llmbatch_pool_backlog_requests",
    "Requests of unfinished shards (queued or running), by pool and tier.",
    ["pool", "tier"],
    registry=REGISTRY,
)
POOL_DRAIN_TARGET = Gauge(
    "llmbatch_pool_drain_target_seconds",
    "The tier's drain target from the BatchPool spec, by pool and tier.",
    ["pool", "tier"],
    registry=REGISTRY,
)
POOL_MAX_SLOTS = Gauge(
    "llmbatch_pool_max_slots",
    "The pool's maxSlots.",
    ["pool"],
    registry=REGISTRY,
)
POOL_SLOT_THROUGHPUT = Gauge(
    "llmbatch_pool_slot_throughput_requests_per_second",
    "Requests per second one slot is assumed (or has been measured) to finish, by pool.",
    ["pool"],
    registry=REGISTRY,
)
POOL_TENANTS = Gauge(
    "llmbatch_pool_tenants_active",
    "Tenants (namespaces) with work waiting or running on the pool.",
    ["pool"],
    registry=REGISTRY,
)
POOL_SHARE_RATIO_MAX = Gauge(
    "llmbatch_pool_tenant_share_ratio_max",
    "The largest seats-held over fair-share ratio among the pool's tenants with work (above 1: "
    "a tenant borrows idle share or the queue has not caught up yet).",
    ["pool"],
    registry=REGISTRY,
)
TENANT_PREEMPTIONS = Counter(
    "llmbatch_pool_tenant_preemptions_total",
    "Running shards taken back from a tenant above its fair share for a tenant below its "
    "guaranteed seats (fairSharing.preemption: BelowGuarantee), by pool.",
    ["pool"],
    registry=REGISTRY,
)
TENANT_SEATS = Gauge(
    "llmbatch_pool_tenant_seats",
    "Seats a tenant holds on the pool, for the tenants the pool's status lists (at most 20 "
    "per pool); only with LLMBATCH_METRICS_TENANT_LABELS=true.",
    ["pool", "tenant"],
    registry=REGISTRY,
)
TENANT_FAIR_SEATS = Gauge(
    "llmbatch_pool_tenant_fair_share_seats",
    "A tenant's fair share of the pool's seats, as llmbatch_pool_tenant_seats lists them; "
    "only with LLMBATCH_METRICS_TENANT_LABELS=true.",
    ["pool", "tenant"],
    registry=REGISTRY,
)
LAST_RECONCILE = Gauge(
    "llmbatch_operator_last_reconcile_timestamp_seconds",
    "Unix time of the operator's last batch reconcile or pool scheduling round (a paused "
    "replica, without the kopf peering lead, does not advance it).",
    registry=REGISTRY,
)
BATCH_OLDEST = Gauge(
    "llmbatch_batch_oldest_in_status_seconds",
    "Age in its current status of the oldest batch in each status (0: none), since this "
    "operator first saw it there.",
    ["status"],
    registry=REGISTRY,
)
BATCH_DURATION = Histogram(
    "llmbatch_batch_duration_seconds",
    "Time from creation to the terminal status, by tier and the status reached.",
    ["tier", "status"],
    buckets=(10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400, 172800, 259200),
    registry=REGISTRY,
)
BATCH_FIRST_RESULT = Histogram(
    "llmbatch_batch_first_result_seconds",
    "Time from creation to the first finished request of a batch, by tier.",
    ["tier"],
    buckets=(1, 5, 10, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400),
    registry=REGISTRY,
)
POOL_REQUESTS = Counter(
    "llmbatch_pool_requests_processed_total",
    "Requests finished by shards as batch progress reports them, by pool, tier and outcome "
    "(completed, failed).",
    ["pool", "tier", "outcome"],
    registry=REGISTRY,
)
REQUESTS_UNSUCCESSFUL = Counter(
    "llmbatch_requests_unsuccessful_total",
    "Error lines of finished batches, by pool, tier and reason: request_error (the batch "
    "completed) or the batch's terminal status (failed, expired, cancelled).",
    ["pool", "tier", "reason"],
    registry=REGISTRY,
)
SHARD_FAILURES = Counter(
    "llmbatch_shard_failures_total",
    "Shards seen entering Failed (retries spent), by pool.",
    ["pool"],
    registry=REGISTRY,
)
SHARD_RERUNS = Counter(
    "llmbatch_shard_reruns_total",
    "Shard runs that ended early and were re-queued, by pool.",
    ["pool"],
    registry=REGISTRY,
)
STORE_SECONDS = Histogram(
    "llmbatch_store_operation_seconds",
    "Time of the operator's object-store calls, by operation.",
    ["op"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
STORE_ERRORS = Counter(
    "llmbatch_store_errors_total",
    "The operator's object-store calls that failed (a missing key is not a failure), by operation.",
    ["op"],
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "llmbatch_webhook_deliveries",
    "Webhook delivery attempts, by outcome: delivered (2xx), http_error, timeout, refused (a "
    "non-public address), network_error, config_error (URL or signing Secret unusable).",
    ["outcome"],
    registry=REGISTRY,
)
WEBHOOK_ENDED = Counter(
    "llmbatch_webhook_deliveries_ended",
    "Webhook deliveries that ended, by outcome: delivered, given_up (failed for the whole retry "
    "period) or abandoned (the BatchWebhook was deleted).",
    ["outcome"],
    registry=REGISTRY,
)
WEBHOOK_ATTEMPT_SECONDS = Histogram(
    "llmbatch_webhook_attempt_duration_seconds",
    "Time of one webhook delivery attempt (resolve, connect, send, answer).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
WEBHOOK_PENDING = Gauge(
    "llmbatch_webhook_deliveries_pending",
    "Webhook deliveries waiting for an attempt (first or retry), as this operator knows them.",
    registry=REGISTRY,
)
WEBHOOK_OUTCOMES = (
    "delivered",
    "http_error",
    "timeout",
    "refused",
    "network_error",
    "config_error",
)
WEBHOOK_ENDINGS = ("delivered", "given_up", "abandoned")

_STATUSES: tuple[str, ...] = get_args(BatchStatus)
_TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


@dataclass
class _Seen:
    """What the metrics remember of one batch between reconciles (never exported per batch)."""

    status: str
    since: float
    counts: tuple[int, int] | None = None  # (completed, failed) at the last look
    shards: dict[int, tuple[str, int]] = field(default_factory=dict)  # index: (phase, reruns)


_known: dict[str, _Seen] = {}
_pools_seen: set[str] = set()
_UNSUCCESSFUL_REASONS = ("request_error", "failed", "expired", "cancelled")


def instrument_store(store: ObjectStore) -> ObjectStore:
    """``store`` with its calls timed and failures counted (``llmbatch_store_*``)."""
    return InstrumentedStore(store, STORE_SECONDS, STORE_ERRORS)


def observe_batch(
    uid: str,
    status: str | None,
    body: dict[str, Any] | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    """Record a batch after a reconcile: ``body`` as read, ``changes`` the status patch sent.

    Feeds the per-status gauges and, from differences to the previous look, the duration,
    first-result, progress, shard-failure and re-run metrics (pool and tier labels only).
    """
    now = time.time()
    LAST_RECONCILE.set(now)
    if status is None:
        gone = _known.pop(uid, None)
        if gone is not None:
            BATCHES.labels(gone.status).dec()
        return
    seen = _known.get(uid)
    if seen is None:
        seen = _known[uid] = _Seen(status, now)
        BATCHES.labels(status).inc()
    elif seen.status != status:  # the gauges move by one: a step costs O(1), not O(batches)
        BATCHES.labels(seen.status).dec()
        BATCHES.labels(status).inc()
        seen.status, seen.since = status, now
    if body is not None:
        _observe_progress(seen, previous_status(body), status, body, changes or {})


def previous_status(body: dict[str, Any]) -> str | None:
    """The OpenAI status the batch had before this reconcile."""
    value = (body.get("status") or {}).get("status")
    return str(value) if value else None


def _observe_progress(
    seen: _Seen, before: str | None, status: str, body: dict[str, Any], changes: dict[str, Any]
) -> None:
    merged = {**(body.get("status") or {}), **changes}
    tier = str((body.get("spec") or {}).get("priority") or "standard")
    pool = str(merged.get("pool") or "")
    created = merged.get("createdAt") or _created(body)
    counts = merged.get("requestCounts") or {}
    completed, failed = int(counts.get("completed") or 0), int(counts.get("failed") or 0)
    if seen.counts is not None and pool:
        was_completed, was_failed = seen.counts
        if was_completed + was_failed == 0 < completed + failed and created:
            BATCH_FIRST_RESULT.labels(tier).observe(max(0.0, time.time() - float(created)))
        POOL_REQUESTS.labels(pool, tier, "completed").inc(max(0, completed - was_completed))
        POOL_REQUESTS.labels(pool, tier, "failed").inc(max(0, failed - was_failed))
    seen.counts = (completed, failed)
    for shard in merged.get("shards") or []:
        index, phase, reruns = shard.get("index"), shard.get("phase"), int(shard.get("reruns") or 0)
        old = seen.shards.get(index)
        if old is not None and pool:
            if phase == "Failed" and old[0] != "Failed":
                SHARD_FAILURES.labels(pool).inc()
            if reruns > old[1]:
                SHARD_RERUNS.labels(pool).inc(reruns - old[1])
        seen.shards[index] = (str(phase), reruns)
    if status in _TERMINAL and before not in _TERMINAL and before is not None:
        if created:
            BATCH_DURATION.labels(tier, status).observe(max(0.0, time.time() - float(created)))
        if failed and pool:
            reason = "request_error" if status == "completed" else status
            REQUESTS_UNSUCCESSFUL.labels(pool, tier, reason).inc(failed)
    if status in _TERMINAL:
        seen.shards.clear()  # a finished batch's shards change no more: keep memory flat


def _created(body: dict[str, Any]) -> float | None:
    stamp = (body.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return None
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()


def _oldest(status: str) -> float:
    now = time.time()
    return max((now - s.since for s in list(_known.values()) if s.status == status), default=0.0)


def _oldest_of(status: str) -> Callable[[], float]:
    return lambda: _oldest(status)


for _status in _STATUSES:
    BATCH_OLDEST.labels(_status).set_function(_oldest_of(_status))
# Every bounded series from the start, so rate() and increase() see the first event.
for _tier in TIERS:
    BATCH_FIRST_RESULT.labels(_tier)
    for _status in sorted(_TERMINAL):
        BATCH_DURATION.labels(_tier, _status)
for _outcome in ("completed", "failed"):
    BATCH_REQUESTS.labels(_outcome)
    REQUESTS_DEPRECATED.labels(_outcome)
for _direction in ("input", "output"):
    TOKENS.labels(_direction)
for _outcome in WEBHOOK_OUTCOMES:
    WEBHOOK_DELIVERIES.labels(_outcome)
for _outcome in WEBHOOK_ENDINGS:
    WEBHOOK_ENDED.labels(_outcome)


def observe_pool(
    name: str,
    backlog: Mapping[str, int],
    drain: Mapping[str, int],
    max_slots: int,
    throughput: float,
) -> None:
    """Record one pool scheduling round: backlog and drain target per tier, size, throughput."""
    LAST_RECONCILE.set(time.time())
    if name not in _pools_seen:  # counters start at 0, so rate() and increase() see the first
        _pools_seen.add(name)
        SHARD_FAILURES.labels(name)
        SHARD_RERUNS.labels(name)
        TENANT_PREEMPTIONS.labels(name)
        for tier in backlog:
            for outcome in ("completed", "failed"):
                POOL_REQUESTS.labels(name, tier, outcome)
            for reason in _UNSUCCESSFUL_REASONS:
                REQUESTS_UNSUCCESSFUL.labels(name, tier, reason)
    POOL_MAX_SLOTS.labels(name).set(max_slots)
    POOL_SLOT_THROUGHPUT.labels(name).set(throughput)
    for tier, requests in backlog.items():
        POOL_BACKLOG.labels(name, tier).set(requests)
        POOL_DRAIN_TARGET.labels(name, tier).set(drain.get(tier, 0))


_tenants_shown: dict[str, set[str]] = {}  # pool -> tenants with per-tenant series


def observe_tenants(name: str, fair: Mapping[str, Any], per_tenant: bool) -> None:
    """Record a pool's tenants (its status's ``fairSharing``): how many have work, the largest
    seats over share; per tenant (bounded to the listed ones) only when ``per_tenant``."""
    listed = fair.get("tenants") or []
    POOL_TENANTS.labels(name).set(fair.get("activeTenants") or 0)
    ratios = [t["seats"] / float(t["share"]) for t in listed if float(t["share"]) > 0]
    POOL_SHARE_RATIO_MAX.labels(name).set(max(ratios, default=0.0))
    if not per_tenant:
        return
    shown = {str(t["namespace"]) for t in listed}
    for gone in _tenants_shown.get(name, set()) - shown:
        for gauge in (TENANT_SEATS, TENANT_FAIR_SEATS):
            with contextlib.suppress(KeyError):
                gauge.remove(name, gone)
    for tenant in listed:
        TENANT_SEATS.labels(name, tenant["namespace"]).set(tenant["seats"])
        TENANT_FAIR_SEATS.labels(name, tenant["namespace"]).set(float(tenant["share"]))
    _tenants_shown[name] = shown


def forget_pool(name: str) -> None:
    """Drop a deleted pool's gauges: a last backlog or queue depth left behind would keep its
    alerts firing. Counters stay (a rate over them falls to zero by itself)."""
    pooled = (JOBS_RUNNING, WARM_SLOTS, DESIRED_SLOTS, POOL_MAX_SLOTS, POOL_SLOT_THROUGHPUT)
    for gauge in (*pooled, POOL_TENANTS, POOL_SHARE_RATIO_MAX):
        with contextlib.suppress(KeyError):
            gauge.remove(name)
    for tenant in _tenants_shown.pop(name, set()):
        for per_tenant in (TENANT_SEATS, TENANT_FAIR_SEATS):
            with contextlib.suppress(KeyError):
                per_tenant.remove(name, tenant)
    for tiered in (QUEUE_DEPTH, POOL_BACKLOG, POOL_DRAIN_TARGET):
        for tier in TIERS:
            with contextlib.suppress(KeyError):
                tiered.remove(name, tier)


def count_finished_requests(completed: int, failed: int) -> None:
    """Count a finished batch's requests by outcome (under the new name and the deprecated)."""
    for outcome, requests in (("completed", completed), ("failed", failed)):
        BATCH_REQUESTS.labels(outcome).inc(requests)
        REQUESTS_DEPRECATED.labels(outcome).inc(requests)


def serve(port: int) -> None:
    """Record the build and expose /metrics on ``port`` (0: no listener)."""
    BUILD_INFO.labels(**build_labels()).set(1)
    if port:
        start_http_server(port, registry=REGISTRY)
