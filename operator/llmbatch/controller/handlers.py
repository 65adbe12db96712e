"""kopf handlers: thin, they hand the object to a reconciler and apply what it returns.

Importing this module registers the handlers with kopf's default registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from llmbatch import logs
from llmbatch.api.resources import GROUP, VERSION, BatchPoolSpec
from llmbatch.controller import metrics
from llmbatch.controller.batches import BatchReconciler, Step
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import REQUEST_TIMEOUT, Kube
from llmbatch.controller.pools import PoolScheduler, running_entry
from llmbatch.controller.retention import RetentionSweeper
from llmbatch.controller.webhooks import WebhookDispatcher
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.lifecycle import TERMINAL
from llmbatch.storage import open_store

FINALIZER = "llmbatch.io/finalizer"
#: Threads for the store calls of every batch and pool (blocking I/O, not CPU).
STORE_THREADS = 32
INTERVAL = float(os.environ.get("LLMBATCH_RECONCILE_INTERVAL", "2"))
#: The tenant namespaces whose Batches this operator serves (LLMBATCH_NAMESPACES; empty: all).
#: kopf itself always watches cluster-wide: BatchPools are cluster-scoped and the peering object
#: is the ClusterKopfPeering, so scoping is a filter on every Batch handler.
SERVED = frozenset(filter(None, os.environ.get("LLMBATCH_NAMESPACES", "").split(",")))

# One reconcile at a time per batch, whichever handler (timer, create, cancel) triggered it.
_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = OperatorConfig.from_env()
    # Store calls run in threads (asyncio.to_thread); the default pool of cpu_count + 4 threads
    # queues a few hundred batches' reads behind each other, on the filesystem store and S3 alike.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=STORE_THREADS, thread_name_prefix="llmbatch-store")
    )
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="llmbatch.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="llmbatch.io", key="last-handled-configuration"
    )
    settings.posting.reporting_component = "llmbatch-operator"
    settings.posting.event_name_prefix = "llmbatch-"
    # Watch-stall recovery: the server closes watches, and a silent one is reopened.
    settings.watching.server_timeout = 240
    settings.watching.client_timeout = 270
    settings.watching.inactivity_timeout = 300
    settings.networking.request_timeout = 60
    settings.peering.name = config.peering
    kube = await Kube.connect(request_timeout=REQUEST_TIMEOUT)
    # kopf only patches the peering object; a missing one means replicas would not see each other.
    await kube.ensure_cluster_peering(config.peering)
    memo.config = config
    memo.kube = kube
    memo.batches = BatchReconciler(
        kube, metrics.instrument_store(open_store(config.store_uri)), config
    )
    memo.pools = PoolScheduler(kube, memo.batches.store, config)
    metrics.serve(config.metrics_port)
    if config.retention_interval > 0:
        # Not a kopf timer: timers put a finalizer on every object they run on, and BatchFiles
        # must stay deletable without the operator (DELETE /v1/files, owner garbage collection).
        sweeper = RetentionSweeper(kube, memo.batches.store, config)
        memo.retention_task = asyncio.create_task(sweeper.run(config.retention_interval))
    if config.webhooks.enabled:
        # Its own task with bounded concurrency: a slow endpoint never holds up a reconcile.
        memo.webhooks = WebhookDispatcher(kube, config.webhooks)
        memo.webhooks_task = asyncio.create_task(memo.webhooks.run())


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    for name in ("retention_task", "webhooks_task"):
        task: asyncio.Task[None] | None = getattr(memo, name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is not None:
        await kube.close()


def _apply(step: Step, body: kopf.Body, patch: kopf.Patch) -> None:
    changes = step.to_patch()
    if changes:
        patch.setdefault("status", {}).update(changes)
    for event_type, reason, message in step.events:
        kopf.event(body, type=event_type, reason=reason, message=message)


async def _reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo) -> None:
    uid = body["metadata"]["uid"]
    name = str(body["metadata"].get("name") or "")
    logs.bind_context(
        batch_id=batch_id_from_name(name) if name.startswith("batch-") else None,
        tenant=body["metadata"].get("namespace"),
    )
    async with _locks[uid]:
        reconciler: BatchReconciler = memo.batches
        step = await reconciler.step(dict(body))
        _apply(step, body, patch)
    before = body.get("status") or {}
    current = step.phase or before.get("status")
    scheduler: PoolScheduler | None = getattr(memo, "pools", None)
    if scheduler is not None and current == "in_progress" and before.get("status") != current:
        # the pool need not wait for the watch to show what this step decided
        scheduler.notice_accepted({**dict(body), "status": {**before, **patch.get("status", {})}})
    metrics.observe_batch(uid, current, dict(body), dict(patch.get("status") or {}))


def _served(namespace: str | None, **_: Any) -> bool:
    return not SERVED or namespace in SERVED


def _active(status: kopf.Status, namespace: str | None, **_: Any) -> bool:
    return _served(namespace) and status.get("status") not in TERMINAL


#: A timer run that failed (the API server restarting, the store down) is retried after this
#: many seconds instead of kopf's default 60.
RETRY_BACKOFF = 5.0


@kopf.timer(
    GROUP,
    VERSION,
    "batches",
    interval=INTERVAL,
    initial_delay=INTERVAL,
    when=_active,
    backoff=RETRY_BACKOFF,
)
async def batch_timer(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Level-based: compare status, slots and store, and take the next step."""
    await _reconcile(body, patch, memo)


@kopf.on.resume(GROUP, VERSION, "batches", when=_served)
@kopf.on.create(GROUP, VERSION, "batches", when=_served)
async def batch_created(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Start at once instead of waiting for the first timer tick; re-attach after a restart."""
    await _reconcile(body, patch, memo)


@kopf.on.field(GROUP, VERSION, "batches", field="spec.cancel", new=True, when=_served)
async def batch_cancel(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """React to a cancel request at once."""
    await _reconcile(body, patch, memo)


@kopf.on.delete(GROUP, VERSION, "batches", when=_served)
async def batch_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Remove the batch's Jobs and work area; its BatchFiles go by owner references."""
    uid = body["metadata"]["uid"]
    async with _locks[uid]:
        reconciler: BatchReconciler = memo.batches
        await reconciler.delete(dict(body))
    _locks.pop(uid, None)
    metrics.observe_batch(uid, None)


@kopf.on.event(GROUP, VERSION, "batches", when=_served)
async def batch_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Hand a finished batch to the webhook dispatcher (no I/O here: it only schedules; async so
    that it runs on the loop, not in kopf's thread pool)."""
    dispatcher: WebhookDispatcher | None = getattr(memo, "webhooks", None)
    if dispatcher is not None:
        dispatcher.notice(body, deleted=event.get("type") == "DELETED")
    scheduler: PoolScheduler | None = getattr(memo, "pools", None)
    if scheduler is not None:
        deleted = event.get("type") == "DELETED"
        scheduler.notice_batch(body.get("status") or {}, body["metadata"]["uid"], deleted=deleted)


@kopf.on.event(GROUP, VERSION, "batchpools")
async def pool_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the pool catalog acceptance chooses from (no I/O: async so it runs on the loop)."""
    reconciler: BatchReconciler | None = getattr(memo, "batches", None)
    if reconciler is not None:
        deleted = event.get("type") == "DELETED"
        reconciler.pool_catalog.notice(dict(body), deleted=deleted)


@kopf.on.event(GROUP, VERSION, "batchwebhooks", when=_served)
async def webhook_seen(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Check a new or changed BatchWebhook (its Ready condition) in the dispatcher's pool."""
    dispatcher: WebhookDispatcher | None = getattr(memo, "webhooks", None)
    if dispatcher is not None:
        dispatcher.notice_webhook(body)


@kopf.index(GROUP, VERSION, "batches", when=_served)
async def running_batches(body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    """The running batches by pool, kept from the watch: a pool round reads these instead of
    listing every Batch (kopf fills the index before any timer runs, so a restarted operator's
    first round sees every running batch)."""
    return running_entry(dict(body))


#: The longest a pool timer run waits for its pool to be due a round (``PoolScheduler.wait_due``:
#: a batch's kick ends the wait at once); the timer runs again POOL_TIMER_GAP after it returns.
#: So a round starts within milliseconds of an acceptance, and back to back while batches keep
#: coming, instead of at the next tick of a fixed timer.
POOL_WAIT_LIMIT = min(INTERVAL, 0.5)
POOL_TIMER_GAP = 0.05


@kopf.timer(
    GROUP,
    VERSION,
    "batchpools",
    interval=POOL_TIMER_GAP,
    initial_delay=0,
    backoff=RETRY_BACKOFF,
)
async def pool_timer(
    name: str,
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    patch: kopf.Patch,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """Size the pool, grant free slots to waiting shards, report slots and queue depth."""
    scheduler: PoolScheduler = memo.pools
    if body.metadata.get("deletionTimestamp"):
        return
    stopped: kopf.DaemonStopped = kwargs["stopped"]
    due = await scheduler.wait_due(name, POOL_WAIT_LIMIT, stopped.wait)
    if not due or stopped.is_set():  # the operator exits or the pool is being deleted
        return
    index: kopf.Index[str, dict[str, Any]] = kwargs["running_batches"]  # kopf passes indexes
    batches = scheduler.running_batches(name, [dict(b) for b in index.get(name, [])])
    result = await scheduler.step(name, dict(spec), dict(status), body.metadata.get("uid"), batches)
    if result.status:
        patch.setdefault("status", {}).update(result.status)
    for event_type, reason, message in result.events:
        kopf.event(body, type=event_type, reason=reason, message=message)


#: How long a pool's deletion waits, beyond its slots' grace period, for their pods to exit.
POOL_DELETE_MARGIN = 60.0


@kopf.on.delete(GROUP, VERSION, "batchpools")
async def pool_deleted(
    name: str, body: kopf.Body, spec: kopf.Spec, memo: kopf.Memo, runtime: Any, **_: Any
) -> None:
    """Delete the pool's slot Jobs and hold the pool until their pods have exited, so a
    finished ``kubectl delete batchpool`` leaves no slot running (the owner references are a
    backstop only: the garbage collector may not watch a new CRD for up to 30 s). A pod that
    outlives its grace period by POOL_DELETE_MARGIN (a lost node) no longer holds the pool."""
    scheduler: PoolScheduler = memo.pools
    pool = BatchPoolSpec.model_validate(dict(spec))
    left = await scheduler.remove(name, body.metadata.get("uid"), pool)
    if not left:
        return
    if runtime.total_seconds() < pool.executor.termination_grace_seconds + POOL_DELETE_MARGIN:
        raise kopf.TemporaryError(f"{left} slot pods of pool {name} still exiting", delay=1)
    kopf.warn(
        body,
        reason="SlotPodsLeft",
        message=f"{left} slot pods of pool {name} did not exit (a lost node?): deleted anyway",
    )


@kopf.on.startup()
async def start_credit_upkeep(memo: kopf.Memo, **_: Any) -> None:
    """Start the CreditAccount upkeep task (docs/billing.md)."""

    async def upkeep() -> None:
        # kopf runs startup handlers concurrently: wait for ``configure`` to fill the memo.
        while getattr(memo, "batches", None) is None:
            await asyncio.sleep(0.1)
        config: OperatorConfig = memo.config
        reconciler: BatchReconciler = memo.batches
        if config.credit_repair_interval > 0:
            await reconciler.credits.run(config.namespaces, config.credit_repair_interval)

    memo.credit_task = asyncio.create_task(upkeep())


@kopf.on.cleanup()
async def stop_credit_upkeep(memo: kopf.Memo, **_: Any) -> None:
    task: asyncio.Task[None] | None = getattr(memo, "credit_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
