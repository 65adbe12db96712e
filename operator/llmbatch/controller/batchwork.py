"""Batches reconciled as they change, through one work queue (``core.workqueue``).

A Batch is reconciled when its object changes (the watch, through :meth:`BatchWork.notice`),
when something about its shards changes (the pool round, :meth:`BatchWork.push`), at a time it
asked for (its expiry, a throttled progress fold, slots still flushing: ``Step.requeue_at``), or
by a slow jittered resync — never by a timer per batch, so a deep backlog of batches nothing
happens to costs nothing. Cancels go first; then acceptances and shard changes by tier (an
expedited batch's finalisation ahead of standard and flex acceptances), tenants taking turns
within each; then progress folds and resyncs; a failed reconcile is retried with backoff.

A worker reads the batch from the cache (``BatchCache``: never older than this operator's own
last write), takes one step, and writes the status patch itself with the ``resourceVersion`` of
the body it stepped on as a precondition: a step on a body someone else changed meanwhile is
refused (409), the batch is read again and stepped again. Events are recorded only after their
patch landed, so a refused step announces nothing, and posted off the reconcile path
(``controller.eventrecorder``): a worker hands the batch's shards to the pool first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from llmbatch import logs
from llmbatch.api.resources import API_VERSION, BATCH_FINALIZER
from llmbatch.background import supervise
from llmbatch.controller import metrics
from llmbatch.controller.batchcache import BatchCache
from llmbatch.controller.batches import BatchReconciler, Step
from llmbatch.controller.batches.step import announce
from llmbatch.controller.eventrecorder import EventRecorder
from llmbatch.controller.kube import Kube
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.lifecycle import TERMINAL
from llmbatch.core.tiers import TIER_RANK, tier_of
from llmbatch.core.workqueue import Priority, WorkQueue
from llmbatch.kube import Conflict, status_replacement

log = logging.getLogger("llmbatch.controller.batches")

COMPONENT = "llmbatch-operator"
#: Phases whose batches are stopping: their shards are being taken back and merged.
STOPPING = frozenset({"finalizing", "cancelling"})
#: Events hold back this long after a worker last finished a new batch's step: the shards of
#: the batches just accepted are granted and start meanwhile (#30's burst).
ADMISSIONS_QUIET = 1.0


def change_priority(
    before: dict[str, Any] | None, after: dict[str, Any], *, initial: bool
) -> Priority | None:
    """How soon a Batch the watch shows changed (and newer than the cache had) needs a step;
    None when it needs none (a terminal batch). ``initial``: kopf's listing at start."""
    if (after.get("metadata") or {}).get("deletionTimestamp"):
        return Priority.URGENT if deleting(after) else None  # its cleanup, whatever its phase
    status = after.get("status") or {}
    phase = status.get("status")
    if phase in TERMINAL:
        return None
    spec = after.get("spec") or {}
    if spec.get("cancel") and phase not in STOPPING:
        return Priority.URGENT
    if phase in (None, "validating"):
        return Priority.ADMIT
    generation = (after.get("metadata") or {}).get("generation")
    if before is not None and generation != (before.get("metadata") or {}).get("generation"):
        return Priority.ADMIT
    if phase in STOPPING:
        return Priority.SHARDS
    return Priority.RESYNC if initial else Priority.SHARDS


def deleting(body: dict[str, Any]) -> bool:
    """Marked for deletion and still carrying the operator's finalizer: its cleanup is due."""
    meta = body.get("metadata") or {}
    return bool(meta.get("deletionTimestamp")) and BATCH_FINALIZER in (meta.get("finalizers") or ())


def tier_rank(body: dict[str, Any]) -> int:
    spec = body.get("spec") or {}
    return TIER_RANK[tier_of(spec.get("priority"), spec.get("metadata"))]


def tenant_of(body: dict[str, Any]) -> str:
    """The batch's tenant, its namespace: the work queue's lanes take turns by it."""
    return str((body.get("metadata") or {}).get("namespace") or "")


class BatchWork:
    """The operator's batch work: a queue, a cache, and the workers that drain them."""

    def __init__(
        self,
        reconciler: BatchReconciler,
        kube: Kube,
        *,
        resync_seconds: float,
        startup_spread_seconds: float,
        served: Callable[[str], bool] = lambda _: True,
        on_step: Callable[[dict[str, Any], Step, dict[str, Any]], None] | None = None,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.reconciler = reconciler
        self.kube = kube
        self.resync_seconds = resync_seconds
        self.startup_spread_seconds = startup_spread_seconds
        self.served = served
        self.on_step = on_step
        """Called after each step with (the body stepped on, the step, its status patch)."""
        self.clock = clock
        self.rng = rng or random.Random()
        self.queue: WorkQueue[str] = WorkQueue(rng=self.rng)
        self.cache = BatchCache()
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._priority: dict[str, Priority] = {}
        self._wake = asyncio.Event()
        self._started = clock()
        self.steps = 0
        """Steps taken since start (for tests and benchmarks)."""
        self.events = EventRecorder(kube, COMPONENT, yield_to=self._admissions_wait)
        self._admitted_at = -float("inf")  # when a worker last finished a new batch's step

    # --- what makes a batch due ----------------------------------------------------------------

    def notice(self, body: dict[str, Any], *, initial: bool = False, deleted: bool = False) -> None:
        """A watch event of a Batch (``initial``: from kopf's listing at start)."""
        uid = body["metadata"]["uid"]
        if deleted:
            self.forget(uid)
            return
        if not self.served(body["metadata"].get("namespace") or ""):
            return
        before, news = self.cache.observe(body)
        if not news:
            return  # the echo of this operator's own write, or older
        priority = change_priority(before, body, initial=initial)
        if priority is None:
            return
        now = self.clock()
        due = now
        if initial and priority is Priority.RESYNC:  # a restart: no herd of thousands at once
            due = now + self.rng.uniform(0, self.startup_spread_seconds)
        self._add(uid, priority, due, body)

    def push(self, uid: str, priority: Priority, due: float | None = None) -> None:
        """Something about the batch's shards changed (the pool round) or it asked for a time."""
        body = self.cache.peek(uid)
        if body is None:
            return
        self._add(uid, priority, self.clock() if due is None else due, body)

    def push_pool(self, pool: str, after: float = 0.0) -> None:
        """The batches running on ``pool`` need a step (it was deleted under them)."""
        due = self.clock() + after
        for body in self.cache.all():
            status = body.get("status") or {}
            if status.get("pool") == pool and status.get("status") not in TERMINAL:
                self._add(body["metadata"]["uid"], Priority.SHARDS, due, body)

    def forget(self, uid: str) -> None:
        self.queue.forget(uid)
        self.cache.drop(uid)
        self._priority.pop(uid, None)
        self.locks.pop(uid, None)

    def _admissions_wait(self) -> bool:
        """Whether new batches (or cancels, deletions) wait for a worker, or one was stepped
        less than :data:`ADMISSIONS_QUIET` ago (their shards' grants follow): Events hold back."""
        now = self.clock()
        return self.queue.waiting(now, Priority.ADMIT) or now - self._admitted_at < ADMISSIONS_QUIET

    def _add(self, uid: str, priority: Priority, due: float, body: dict[str, Any]) -> None:
        """Queue the batch ``body`` (by its tier and tenant) for ``priority`` at ``due``."""
        self.queue.add(
            uid, priority, self.clock(), due=due, tier_rank=tier_rank(body), tenant=tenant_of(body)
        )
        best = self._priority.get(uid)
        self._priority[uid] = priority if best is None else min(best, priority)
        self._wake.set()

    def all_batches(self) -> list[dict[str, Any]] | None:
        """Every cached Batch (read only), once the watch's first listing is surely in it."""
        if self.clock() - self._started < self.startup_spread_seconds:
            return None
        return self.cache.all()

    def accepted_of(self, namespace: str) -> int | None:
        """How many of the namespace's batches are accepted and not finished, once the watch's
        first listing is surely in the cache (None before: the caller lists them)."""
        if self.clock() - self._started < self.startup_spread_seconds:
            return None
        return self.cache.accepted_in(namespace)

    def batches_of(self, namespace: str) -> list[dict[str, Any]] | None:
        """The namespace's Batches from the cache, once the watch's first listing is surely in
        it (after the startup spread); None before (the caller lists them)."""
        if self.clock() - self._started < self.startup_spread_seconds:
            return None
        return self.cache.in_namespace(namespace)

    # --- the workers ---------------------------------------------------------------------------

    async def run(self, workers: int, stop: asyncio.Event) -> None:
        """Drain the queue with ``workers`` concurrent reconciles until ``stop`` is set."""
        restarts = metrics.TASK_RESTARTS  # a worker or the recorder that fails is run again
        tasks = [
            supervise("reconcile-worker", lambda: self._worker(stop), restarts)
            for _ in range(workers)
        ]
        tasks.append(supervise("event-recorder", self.events.run, restarts))
        try:
            await stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.events.close()

    async def run_due(self) -> int:
        """Reconcile, one at a time, every batch due now (and what that makes due); the number
        of reconciles. The workers' loop without the waiting: for tests and tools."""
        count = 0
        while (uid := self.queue.pop(self.clock())) is not None:
            await self._work_on(uid)
            count += 1
        await self.events.flush()
        return count

    async def _worker(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            uid = self.queue.pop(self.clock())
            if uid is None:
                await self._idle()
                continue
            await self._work_on(uid)
            if self.queue.next_due() is not None:
                self._wake.set()

    async def _work_on(self, uid: str) -> None:
        """One reconcile of a key the queue handed out; a failure is retried after backoff."""
        priority = self._priority.pop(uid, Priority.RESYNC)
        try:
            await self._reconcile(uid, priority)
        except Exception:
            delay = self.queue.failed(uid, self.clock(), priority)
            self._priority[uid] = min(self._priority.get(uid, priority), priority)
            log.exception("batch %s: reconcile failed; again in %.1f s", uid, delay)
        else:
            self.queue.done(uid, self.clock())
        if priority <= Priority.ADMIT:
            self._admitted_at = self.clock()

    async def _idle(self) -> None:
        """Wait until a key is added or the next one becomes due."""
        self._wake.clear()
        due = self.queue.next_due()
        timeout = None if due is None else max(0.0, due - self.clock())
        if timeout == 0.0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _reconcile(self, uid: str, priority: Priority) -> None:
        body = self.cache.get(uid)
        if body is None:
            return
        meta = body["metadata"]
        name = str(meta.get("name") or "")
        logs.bind_context(
            batch_id=batch_id_from_name(name) if name.startswith("batch-") else None,
            tenant=meta.get("namespace"),
        )
        if deleting(body):
            await self._clean_up(uid, body, priority)
            return
        async with self.locks[uid]:
            try:
                held = await self._hold(body)
                if held is None:
                    return
                body = held
                step = await self.reconciler.step(body)
                self.steps += 1
                patch = step.to_patch()
                await self._write(body, patch)
            except Conflict:
                await self._reread(body)
                self._add(uid, priority, self.clock(), body)
                return
        if self.on_step is not None:  # the pool first: its shards wait for nothing else
            self.on_step(body, step, patch)
        self._announce(body, step)
        self._schedule(uid, body, step)

    async def _hold(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The batch with the operator's finalizer on it (added once to a Batch created
        without it); None when it is gone. :class:`Conflict` when it changed meanwhile."""
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or ())
        if meta.get("deletionTimestamp"):
            return None  # going, and not the operator's to clean up
        if BATCH_FINALIZER in finalizers:
            return body
        written = await self.kube.patch_custom_at(
            "batches",
            meta["namespace"],
            meta["name"],
            {"metadata": {"finalizers": [*finalizers, BATCH_FINALIZER]}},
            meta.get("resourceVersion"),
        )
        if written is not None:
            self.cache.put(written)
        return written

    async def _clean_up(self, uid: str, body: dict[str, Any], priority: Priority) -> None:
        """A Batch marked for deletion: its shards taken back, its work area and result bytes
        removed (``BatchReconciler.delete``), then the finalizer let go, which lets the API
        server remove it. Idempotent: a cleanup cut short is taken again from the start."""
        meta = body["metadata"]
        async with self.locks[uid]:
            await self.reconciler.delete(body)
            kept = [f for f in meta.get("finalizers") or () if f != BATCH_FINALIZER]
            try:
                await self.kube.patch_custom_at(
                    "batches",
                    meta["namespace"],
                    meta["name"],
                    {"metadata": {"finalizers": kept or None}},
                    meta.get("resourceVersion"),
                )
            except Conflict:
                await self._reread(body)
                self._add(uid, priority, self.clock(), body)
                return
        self.forget(uid)

    async def _write(self, body: dict[str, Any], patch: dict[str, Any]) -> None:
        """The status the step's patch makes, PUT on the version it was decided on (cheaper for
        the API server than the merge patch: nothing to decode and apply); the result cached."""
        if not patch:
            return
        meta = body["metadata"]
        written = await self.kube.replace_custom_status(
            "batches",
            meta["namespace"],
            meta["name"],
            status_replacement(body, patch, api_version=API_VERSION, kind="Batch"),
        )
        if written is not None:
            self.cache.put(written)

    async def _reread(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        fresh = await self.kube.get_custom("batches", meta["namespace"], meta["name"])
        if fresh is None:
            self.forget(meta["uid"])
        else:
            self.cache.put(fresh)

    def _announce(self, body: dict[str, Any], step: Step) -> None:
        """The step's patch landed: its phase changes are logged and counted, its Events
        recorded for posting."""
        meta = body["metadata"]
        announce(meta["namespace"], meta["name"], step)
        involved = {
            "apiVersion": API_VERSION,
            "kind": "Batch",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
        for event_type, reason, message in step.posted_events():
            self.events.record(involved, reason, message, warning=event_type == "Warning")

    def _schedule(self, uid: str, body: dict[str, Any], step: Step) -> None:
        """The times the batch asked for, and its safety resync while it is not finished."""
        phase = step.phase or (body.get("status") or {}).get("status")
        if phase in TERMINAL:
            return
        now = self.clock()
        if step.requeue_at is not None:
            self._add(uid, Priority.SHARDS, max(now, step.requeue_at), body)
        resync = self.resync_seconds * self.rng.uniform(0.8, 1.2)
        self._add(uid, Priority.RESYNC, now + resync, body)
