"""The Batch reconciler: one idempotent step per call, all state on the object.

``BatchReconciler.step`` reads the Batch (typed, once) and the store, takes the next step
of the lifecycle and returns the typed status patch plus the Events to post. The work queue
(``controller.batchwork``) calls it when the batch or its shards change, at the times a step asks
for, and on a slow resync; a restarted operator simply continues: nothing is kept in memory but
throttling timestamps. Each phase lives in its own module: ``validate``, ``run``, ``finalize``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from llmbatch.api.resources import (
    BatchBilling,
    BatchConditionType,
    BatchEndReason,
    BatchPoolSpec,
    Phase,
    RequestCounts,
)
from llmbatch.controller.archive import is_archived
from llmbatch.controller.batches.finalize import Finalization
from llmbatch.controller.batches.gputime import gpu_time_charge
from llmbatch.controller.batches.run import ShardRuns
from llmbatch.controller.batches.step import (
    TERMINAL,
    BatchView,
    Step,
    enter_phase_conditions,
    observe_generation,
    set_condition,
    transition,
)
from llmbatch.controller.batches.validate import Validation
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.credits import CreditLedger
from llmbatch.controller.kube import Kube
from llmbatch.controller.poolcatalog import PoolCatalog
from llmbatch.core import keys, lifecycle, tiers
from llmbatch.core.billing import holds_reservation
from llmbatch.core.ids import batch_id_from_name
from llmbatch.storage.base import ObjectStore, delete_under

#: Phases a step goes on from at once, on the status it has just decided.
CHAINED = frozenset({Phase.VALIDATING, Phase.IN_PROGRESS, Phase.FINALIZING, Phase.CANCELLING})


class BatchReconciler:
    """Drives Batches through validating → in_progress → finalizing → terminal."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.store = store
        self.config = config
        self.clock = clock
        self.credits = CreditLedger(kube, config.namespaces, clock)
        self.pool_catalog = PoolCatalog(
            lambda: kube.list_custom("batchpools"),
            lambda name: kube.get_custom("batchpools", None, name),
            served=lambda name: not config.pools or name in config.pools,
        )
        """The BatchPools from the watch (``handlers.pool_seen``): acceptance chooses from it."""
        self.validation = Validation(
            kube,
            store,
            self.credits,
            self.pool_catalog,
            clock,
            config.remote_media,
            caps=config.tenant_caps,
        )
        self.runs = ShardRuns(kube, store, config, self.pool)
        self.finalization = Finalization(kube, store, config, self.pool)
        self._pools: dict[str, tuple[float, BatchPoolSpec | None]] = {}  # name -> (read at, spec)
        self._pool_reads: dict[str, asyncio.Future[BatchPoolSpec | None]] = {}

    async def pool(self, name: str | None) -> BatchPoolSpec | None:
        """The spec of BatchPool ``name``, or None when there is none (deleted).

        Read at most once per reconcile interval per pool, and by one call at a time (the
        reconciles of many batches asking at once share it): every running batch asks for its
        pool on every step. An edit or a deletion is seen an interval later.
        """
        if not name:
            return None
        now = self.clock()
        cached = self._pools.get(name)
        if cached is not None and now - cached[0] < self.config.reconcile_interval:
            return cached[1]
        reading = self._pool_reads.get(name)
        if reading is None:
            reading = asyncio.ensure_future(self._read_pool(name))
            self._pool_reads[name] = reading
            reading.add_done_callback(lambda _: self._pool_reads.pop(name, None))
        spec = await asyncio.shield(reading)
        self._pools[name] = (now, spec)
        return spec

    async def _read_pool(self, name: str) -> BatchPoolSpec | None:
        body = await self.kube.get_custom("batchpools", None, name)
        return None if body is None else BatchPoolSpec.model_validate(body.get("spec") or {})

    # --- entry point ---------------------------------------------------------------------------

    async def step(self, body: dict[str, Any]) -> Step:
        batch = BatchView.parse(body)
        now = self.clock()
        step = Step()
        await self._dispatch(batch, step, now)
        while step.phase in CHAINED and step.phase != batch.status.status:
            # A batch just created is validated in the same step, one just accepted has its
            # shard specs written, and one whose shards all ended (or that is cancelled or
            # expired) has them taken back and, once none runs, its results merged: each phase
            # runs on the view the previous one left, instead of waiting a timer tick for its
            # own patch to come back.
            batch = batch.after(step)
            await self._dispatch(batch, step, now)
        if step.phase in TERMINAL:
            await self._settle(batch, step, now)
            self.runs.forget(batch.uid)
        return step

    async def _dispatch(self, batch: BatchView, step: Step, now: float) -> None:
        phase = batch.status.status
        expired = now >= (batch.status.expires_at or now + 1)
        if phase is None:
            self._initialise(batch, step, now)
        elif phase in TERMINAL:
            # Nothing runs any more (the timer skips terminal batches); a spec edited after the
            # end (a late cancel) is only recorded as observed, so kstatus tools do not take the
            # finished batch for one in progress.
            observe_generation(step, batch)
        elif phase == Phase.VALIDATING:
            if batch.spec.cancel:
                self._finish_without_running(batch, step, now, Phase.CANCELLED)
            elif expired:
                self._finish_without_running(batch, step, now, Phase.EXPIRED)
            else:
                await self.validation.run(batch, step, now)
        elif phase == Phase.IN_PROGRESS:
            if batch.spec.cancel:
                message = "Cancel requested: taking the shards back, keeping finished results"
                transition(step, batch, Phase.CANCELLING, now, "CancelRequested", message)
            elif expired:
                message = "Completion window passed: taking the shards back"
                transition(step, batch, Phase.FINALIZING, now, "Expired", message)
                message = "The completion window passed before every request ran."
                expired_window = BatchConditionType.EXPIRED
                set_condition(step, batch, expired_window, True, "WindowPassed", message, now)
            else:
                await self.runs.run(batch, step, now)
        elif phase in (Phase.CANCELLING, Phase.FINALIZING):
            await self.finalization.run(batch, step, now)

    def _initialise(self, batch: BatchView, step: Step, now: float) -> None:
        tier = tiers.tier_of(batch.spec.priority, batch.spec.metadata)
        window = tiers.completion_window(tier, batch.spec.completion_window)
        step.set(
            status=Phase.VALIDATING,
            created_at=batch.created,
            expires_at=batch.created + lifecycle.window_seconds(window),
            request_counts=RequestCounts(),
            observed_generation=batch.generation,
        )
        if batch.spec.model:
            step.set(model=batch.spec.model)
        message = f"Batch {batch_id_from_name(batch.name)} accepted; validating"
        enter_phase_conditions(step, batch, Phase.VALIDATING, "Accepted", message, now)
        step.event("Accepted", message)
        step.transitions.append((Phase.VALIDATING, "Accepted", message))

    def _finish_without_running(
        self, batch: BatchView, step: Step, now: float, phase: Phase
    ) -> None:
        if phase == Phase.CANCELLED:
            step.set(cancelling_at=int(now))
        total = (batch.status.request_counts or RequestCounts()).total
        step.set(request_counts=RequestCounts(total=total, completed=0, failed=total))
        reason = BatchEndReason.CANCELLED if phase == Phase.CANCELLED else BatchEndReason.EXPIRED
        transition(step, batch, phase, now, reason, f"Batch {phase} before any request ran")

    # --- credit --------------------------------------------------------------------------------

    async def _settle(self, batch: BatchView, step: Step, now: float) -> None:
        """At a terminal state: release the reservation and charge the cost, exactly once.

        The account write removes the reservation together with adding the charge, so a second
        run (the status patch was lost, the operator restarted) finds no reservation and
        charges nothing; ``billing.settledAt`` records it on the batch.
        """
        recorded = step.patch.billing if step.has("billing") else batch.status.billing
        charges = recorded or BatchBilling()
        if charges.settled_at:
            return
        cost = str((step.patch.cost if step.has("cost") else None) or batch.status.cost or "0")
        if holds_reservation(recorded):
            await self.credits.settle(batch.namespace, batch.name, cost)
        step.set(billing=charges.model_copy(update={"settled_at": int(now)}))

    # --- deletion ------------------------------------------------------------------------------

    async def delete(self, body: dict[str, Any]) -> None:
        """Take the batch's shards back from their slots, remove its work area and result bytes
        (their BatchFiles are owned). A batch retention archived keeps its results: their
        BatchFiles were orphaned and expire on their own clock (controller/archive.py)."""
        batch = BatchView.parse(body)
        await self._release_on_delete(batch)
        await self.finalization.release_shards(batch)
        prefix = keys.work_prefix(batch.namespace, batch.uid) + "/"
        results = [
            keys.file_key(batch.namespace, keys.derived_file_id(batch.uid, purpose))
            for purpose in ("output", "errors")
            if not is_archived(body)
        ]

        def remove() -> None:
            delete_under(self.store, prefix)
            for key in results:  # the garbage collector removes the objects, not the bytes
                self.store.delete(key)

        await asyncio.to_thread(remove)
        self.runs.forget(batch.uid)

    async def _release_on_delete(self, batch: BatchView) -> None:
        """A batch deleted before it ended gives its reservation back; on a private pool the
        GPU time it used so far is charged, like a cancel."""
        charges = batch.status.billing or BatchBilling()
        if charges.settled_at or not holds_reservation(batch.status.billing):
            return
        charge = "0"
        if charges.mode == "GPUTime":
            pool = await self.pool(batch.status.pool)
            _, charge = await gpu_time_charge(
                self.store, batch.namespace, batch.uid, batch.status, pool, charges.gpu_hour_price
            )
        await self.credits.settle(batch.namespace, batch.name, charge)
