"""kopf handlers: thin, they hand the object to a reconciler and apply what it returns.

Importing this module registers the handlers with kopf's default registry.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from llmbatch.api.resources import GROUP, VERSION, BatchPoolSpec
from llmbatch.background import stop, supervise
from llmbatch.controller import metrics
from llmbatch.controller.batches import BatchReconciler, Step
from llmbatch.controller.batchwork import BatchWork
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import REQUEST_TIMEOUT, Kube
from llmbatch.controller.namespaces import NamespaceCache
from llmbatch.controller.offboarding import TenantSweeper
from llmbatch.controller.pools import PoolScheduler
from llmbatch.controller.retention import RetentionSweeper
from llmbatch.controller.runningindex import RunningIndex
from llmbatch.controller.webhooks import WebhookDispatcher
from llmbatch.core.tierprices import price_condition, price_verdict
from llmbatch.storage import open_store

#: kopf's finalizer, on BatchPools (their deletion handler). Batches carry the operator's own
#: (``BATCH_FINALIZER``, cleaned up through the work queue); kopf drops its old one from them.
FINALIZER = "llmbatch.io/finalizer"
#: How long a stopping operator waits for its workers to end and its Events to be posted.
WORK_STOP_SECONDS = 10.0
#: Threads for the store calls of every batch and pool (blocking I/O, not CPU).
STORE_THREADS = 32
INTERVAL = float(os.environ.get("LLMBATCH_RECONCILE_INTERVAL", "2"))
#: The tenant namespaces whose Batches this operator serves (LLMBATCH_NAMESPACES; empty: all).
#: kopf itself always watches cluster-wide: BatchPools are cluster-scoped and the peering object
#: is the ClusterKopfPeering, so scoping is a filter on every Batch handler.
SERVED = frozenset(filter(None, os.environ.get("LLMBATCH_NAMESPACES", "").split(",")))
#: The BatchPools this operator schedules (LLMBATCH_POOLS; empty: all), a filter on every pool
#: handler as SERVED is on the Batch handlers: operators on disjoint tenants and pools never meet.
SERVED_POOLS = frozenset(filter(None, os.environ.get("LLMBATCH_POOLS", "").split(",")))


class WatchOnlyBatches(kopf.AnnotationsDiffBaseStorage):
    """kopf's essence of an object, which it builds (a deep copy) for every watch event to find
    what changed, left empty for Batches: their only kopf handler watches events, and changes
    are found by the work queue (``controller.batchwork``), so nothing reads a Batch's diff.
    BatchPools keep it (their deletion handler is a changing handler)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        if body.get("kind") == "Batch":
            return kopf.BodyEssence()
        return super().build(body=body, extra_fields=extra_fields)


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
    settings.persistence.diffbase_storage = WatchOnlyBatches(
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
    settings.peering.lifetime = config.peering_lifetime
    kube = await Kube.connect(request_timeout=REQUEST_TIMEOUT)
    # kopf only patches the peering object; a missing one means replicas would not see each other.
    await kube.ensure_cluster_peering(config.peering)
    memo.config = config
    memo.kube = kube
    # The pool rounds' index of running batches: one listing now, before kopf's watches start
    # (not a kopf index: kopf's readiness wait for one is quadratic in the Batches present).
    memo.running = RunningIndex()
    await memo.running.seed(kube.iter_custom("batches"), _served)
    memo.batches = BatchReconciler(
        kube, metrics.instrument_store(open_store(config.store_uri)), config
    )
    memo.pools = PoolScheduler(kube, memo.batches.store, config)
    memo.namespaces = NamespaceCache()
    memo.pools.slots.tenant_weight = memo.namespaces.weight
    memo.batches.validation.namespace_annotations = memo.namespaces.annotations
    memo.batches.validation.namespace_labels = memo.namespaces.labels
    memo.price_verdicts = {}  # pool name -> the TierPricesOrdered verdict last patched
    memo.work = BatchWork(
        memo.batches,
        kube,
        resync_seconds=config.resync_seconds,
        startup_spread_seconds=config.startup_spread_seconds,
        served=lambda namespace: _served(namespace),
        on_step=_stepped(memo),
    )
    memo.pools.on_shards_changed = memo.work.push
    memo.batches.credits.batches_of = memo.work.batches_of
    memo.batches.validation.accepted_batches = memo.work.accepted_of
    memo.work_stop = asyncio.Event()
    # Every long-lived task runs under a supervisor (llmbatch.background): one that fails is
    # run again after a backoff, logged and counted, never left dead.
    memo.work_task = supervise(
        "batch-work",
        lambda: memo.work.run(config.reconcile_workers, memo.work_stop),
        metrics.TASK_RESTARTS,
    )
    metrics.serve(config.metrics_port)
    if config.retention_interval > 0:
        # Not a kopf timer: timers put a finalizer on every object they run on, and BatchFiles
        # must stay deletable without the operator (DELETE /v1/files, owner garbage collection).
        sweeper = RetentionSweeper(kube, memo.batches.store, config)
        sweeper.batches = memo.work.all_batches
        sweeper.tenants = memo.namespaces.identity
        memo.retention_task = supervise(
            "retention-sweep", lambda: sweeper.run(config.retention_interval), metrics.TASK_RESTARTS
        )
        memo.offboarding = TenantSweeper(kube, memo.batches.store, config)
        memo.offboarding_task = supervise(
            "tenant-sweep",
            lambda: memo.offboarding.run(config.retention_interval),
            metrics.TASK_RESTARTS,
        )
    if config.webhooks.enabled:
        # Its own task with bounded concurrency: a slow endpoint never holds up a reconcile.
        memo.webhooks = WebhookDispatcher(kube, config.webhooks)
        memo.webhooks_task = supervise(
            "webhook-dispatcher", memo.webhooks.run, metrics.TASK_RESTARTS
        )


@kopf.on.cleanup()
async def close(memo: kopf.Memo, **_: Any) -> None:
    work_stop: asyncio.Event | None = getattr(memo, "work_stop", None)
    if work_stop is not None:
        work_stop.set()
    tasks = ("retention_task", "offboarding_task", "webhooks_task")
    await stop(*(getattr(memo, name, None) for name in tasks))
    work_task: asyncio.Task[None] | None = getattr(memo, "work_task", None)
    if work_task is not None:  # it ends itself once told to stop, posting the Events held
        await asyncio.wait({work_task}, timeout=WORK_STOP_SECONDS)
        await stop(work_task)
    dispatcher: WebhookDispatcher | None = getattr(memo, "webhooks", None)
    if dispatcher is not None:
        await dispatcher.close()
    kube: Kube | None = getattr(memo, "kube", None)
    if kube is not None:
        await kube.close()


def _stepped(memo: kopf.Memo) -> Any:
    """What follows each batch step: the pool sees a batch it just accepted before the watch
    shows it, and the metrics see the step."""

    def stepped(body: dict[str, Any], step: Step, changes: dict[str, Any]) -> None:
        before = body.get("status") or {}
        current = step.phase or before.get("status")
        scheduler: PoolScheduler | None = getattr(memo, "pools", None)
        if scheduler is not None and current == "in_progress" and before.get("status") != current:
            scheduler.notice_accepted({**body, "status": {**before, **changes}})
        metrics.observe_batch(body["metadata"]["uid"], current, body, changes)

    return stepped


def _served(namespace: str | None, **_: Any) -> bool:
    return not SERVED or namespace in SERVED


def _served_pool(name: str | None, **_: Any) -> bool:
    return not SERVED_POOLS or name in SERVED_POOLS


@kopf.on.event(GROUP, VERSION, "batches", when=_served)
async def batch_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Every change of a Batch: queue its reconcile by what changed (the work queue; a Batch
    marked for deletion gets its cleanup there, before its finalizer is let go), kick its
    pool when it has shards to place, hand a finished one to the webhook dispatcher. No I/O
    here (async so that it runs on the loop, not in kopf's thread pool)."""
    deleted = event.get("type") == "DELETED"
    running: RunningIndex | None = getattr(memo, "running", None)
    if running is not None:
        running.notice(body, deleted=deleted)
    work: BatchWork | None = getattr(memo, "work", None)
    if work is not None:
        work.notice(dict(body), initial=event.get("type") is None, deleted=deleted)
    dispatcher: WebhookDispatcher | None = getattr(memo, "webhooks", None)
    if dispatcher is not None:
        dispatcher.notice(body, deleted=deleted)
    if deleted:
        metrics.observe_batch(body["metadata"]["uid"], None)
    scheduler: PoolScheduler | None = getattr(memo, "pools", None)
    if scheduler is not None:
        scheduler.notice_batch(body, deleted=deleted)


@kopf.on.event(GROUP, VERSION, "batchpools", when=_served_pool)
async def pool_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the pool catalog acceptance chooses from; a pool gone makes its running batches
    reconcile (they end with pool_deleted lines). No I/O: async so it runs on the loop."""
    deleted = event.get("type") == "DELETED"
    reconciler: BatchReconciler | None = getattr(memo, "batches", None)
    if reconciler is not None:
        reconciler.pool_catalog.notice(dict(body), deleted=deleted)
    work: BatchWork | None = getattr(memo, "work", None)
    if work is not None and deleted:
        reconciler_interval = memo.config.reconcile_interval
        # after the reconciler's read of the pool expires, so it sees the pool gone
        work.push_pool(body["metadata"]["name"], after=reconciler_interval + 0.5)


@kopf.on.event("", "v1", "namespaces")
async def namespace_seen(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Keep the tenants' annotations (fair-share weights, the expedited switch) for the pool
    rounds and acceptance, and their identities for the archive and offboarding. No I/O:
    async so it runs on the loop."""
    namespaces: NamespaceCache | None = getattr(memo, "namespaces", None)
    if namespaces is not None:
        namespaces.notice(dict(body), deleted=event.get("type") == "DELETED")
    offboarding: TenantSweeper | None = getattr(memo, "offboarding", None)
    if offboarding is not None:
        offboarding.notice(body)


@kopf.on.event(GROUP, VERSION, "creditaccounts", when=_served)
async def credit_account_seen(
    event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    """Keep the accounts acceptance looks at first (``controller.accountcache``). No I/O."""
    reconciler: BatchReconciler | None = getattr(memo, "batches", None)
    if reconciler is not None:
        reconciler.credits.accounts.notice(dict(body), deleted=event.get("type") == "DELETED")


@kopf.on.event(GROUP, VERSION, "batchwebhooks", when=_served)
async def webhook_seen(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Check a new or changed BatchWebhook (its Ready condition) in the dispatcher's pool."""
    dispatcher: WebhookDispatcher | None = getattr(memo, "webhooks", None)
    if dispatcher is not None:
        dispatcher.notice_webhook(body)


#: A pool timer run that failed (the API server restarting, the store down) is retried after
#: this many seconds instead of kopf's default 60.
RETRY_BACKOFF = 5.0

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
    when=_served_pool,
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
    running: RunningIndex = memo.running  # seeded in configure, before any watch or timer

    def batches() -> list[dict[str, Any]]:  # copied only for a round that decides something
        return scheduler.running_batches(name, [dict(b) for b in running.get(name)])

    result = await scheduler.step(name, dict(spec), dict(status), body.metadata.get("uid"), batches)
    if result.status:
        patch.setdefault("status", {}).update(result.status)
    generation = body.metadata.get("generation")
    if generation is not None and status.get("observedGeneration") != generation:
        # the round acted on this spec: batches accepted from now on see it (e.g. a revision)
        patch.setdefault("status", {})["observedGeneration"] = generation
    for event_type, reason, message in [
        *result.events,
        *_price_condition(name, spec, status, patch, memo),
    ]:
        kopf.event(body, type=event_type, reason=reason, message=message)


def _price_condition(
    name: str, spec: kopf.Spec, status: kopf.Status, patch: kopf.Patch, memo: kopf.Memo
) -> list[tuple[str, str, str]]:
    """Patch the pool's TierPricesOrdered condition when the status shows another; its Event,
    once per change: the verdict last announced is remembered, so a round that runs before the
    watch shows the patch (and patches the same condition again) does not warn twice."""
    pool = BatchPoolSpec.model_validate(dict(spec))
    conditions, event = price_condition(pool, status.get("conditions"), time.time())
    if conditions is None:
        return []
    patch.setdefault("status", {})["conditions"] = conditions
    announced: dict[str, tuple[str, str, str]] = memo.price_verdicts
    verdict = price_verdict(pool)
    if announced.get(name) == verdict:
        return []
    announced[name] = verdict
    return [event] if event else []


#: How long a pool's deletion waits, beyond its slots' grace period, for their pods to exit.
POOL_DELETE_MARGIN = 60.0


@kopf.on.delete(GROUP, VERSION, "batchpools", when=_served_pool)
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
        getattr(memo, "price_verdicts", {}).pop(name, None)  # a pool of this name starts afresh
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

    memo.credit_task = supervise("credit-upkeep", upkeep, metrics.TASK_RESTARTS)


@kopf.on.cleanup()
async def stop_credit_upkeep(memo: kopf.Memo, **_: Any) -> None:
    await stop(getattr(memo, "credit_task", None))
