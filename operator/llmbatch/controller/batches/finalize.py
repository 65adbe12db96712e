"""The ``finalizing`` and ``cancelling`` phases: take the shards back from their slots, merge
the chunks into the output and error files (a line for every request), publish them as
BatchFiles, fix the cost and end the batch completed, cancelled, expired — or failed when its
pool was deleted."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from llmbatch.api import labels
from llmbatch.api.resources import (
    API_VERSION,
    BatchConditionType,
    BatchEndReason,
    BatchPoolSpec,
    Phase,
    RequestCounts,
    ShardStatus,
    Usage,
)
from llmbatch.api.slot import ShardLease
from llmbatch.controller import metrics
from llmbatch.controller.batches.deps import PhaseDeps
from llmbatch.controller.batches.gputime import busy_shares, charge_of
from llmbatch.controller.batches.merge import MergedResults, ShardOutcome, merge_shard_outputs
from llmbatch.controller.batches.step import BatchView, Step, error, transition
from llmbatch.controller.jobs import LABEL_BATCH_UID, slot_selector
from llmbatch.controller.slotstate import work_key
from llmbatch.core import keys, shardbook
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.lifecycle import cost_of
from llmbatch.core.retention import output_expires_at
from llmbatch.core.validation.shards import ShardRange
from llmbatch.storage.base import ObjectExists
from llmbatch.storage.slotchannel import SlotChannel, fence_lease, read_lease

#: While slots still flush a stopping batch's shards, it looks again this often...
FLUSH_RECHECK_SECONDS = 1.0
#: ...and this often once a cancelled batch's requests have run that long (a cancel lets them
#: finish for up to ``cancelDrainSeconds``; a shard that ends wakes the batch anyway, through
#: the pool round, so this is only the safety net — not a slot listing a second for 10 min).
CANCEL_RECHECK_AFTER_SECONDS = 30.0
CANCEL_RECHECK_SECONDS = 5.0

log = logging.getLogger("llmbatch.controller.batches")


class Finalization(PhaseDeps):
    """Runs the ``finalizing`` / ``cancelling`` phase of one batch per call (idempotent)."""

    async def worker_namespace(self, batch: BatchView) -> str | None:
        """Where the pool's slots run: recorded at acceptance; the pool's for older batches."""
        if batch.status.worker_namespace:
            return batch.status.worker_namespace
        pool: BatchPoolSpec | None = await self.pool_of(batch.status.pool)
        return None if pool is None else pool.worker_namespace

    async def _leases(self, batch: BatchView) -> list[tuple[int, ShardLease]]:
        """(index, lease) of the batch's shards a slot holds."""
        found = []
        for index in _indexes(batch):
            prefix = keys.shard_prefix(batch.namespace, batch.uid, index)
            lease = await asyncio.to_thread(read_lease, self.store, keys.shard_lease_key(prefix))
            if lease is not None and lease.slot:
                found.append((index, lease))
        return found

    async def _plan(self, batch: BatchView) -> list[ShardRange]:
        """Every shard's range: the stored plan's, else the listed shards'."""
        plan = batch.status.shard_plan
        if plan is not None:
            return shardbook.parse_plan(await asyncio.to_thread(self.store.get, plan.key))
        return [shardbook.range_of(s) for s in batch.status.shards or []]

    def _channel(self, batch: BatchView, slot: str) -> SlotChannel:
        return SlotChannel(self.store, keys.slot_prefix(batch.status.pool or "", slot))

    async def release_shards(self, batch: BatchView) -> None:
        """Take the batch's shards back from their slots (when the Batch is deleted)."""
        for index, lease in await self._leases(batch):
            channel = self._channel(batch, lease.slot)
            await asyncio.to_thread(channel.revoke, work_key(batch.uid, index))

    async def _stop_shards(self, batch: BatchView) -> bool:
        """Take the batch's shards back from their slots; True once none can still write.

        A slot stops feeding a revoked shard and commits what finished; once no live slot
        reports it running, its lease moves to a new generation held by nobody (``fenced``), so
        a commit of any straggler is refused, no grant follows, and the merge sees the final
        set of chunks.
        """
        leases = await self._leases(batch)
        # A done lease records its holder's report that the run ended: nothing of it runs, and
        # a batch whose shards all ended so (the usual case) needs no listing of the slots.
        unended = any(lease.state != "done" for _, lease in leases)
        namespace = await self.worker_namespace(batch) if unended else None
        slots: set[str] = set()
        if namespace is not None and batch.status.pool:
            selector = slot_selector(batch.status.pool)
            slots = {j["metadata"]["name"] for j in await self.kube.list_jobs(namespace, selector)}
        stopped = True
        cancelling = batch.status.status == Phase.CANCELLING
        for index, lease in leases:
            key = work_key(batch.uid, index)
            channel = self._channel(batch, lease.slot)
            if cancelling and lease.state == "granted":
                await asyncio.to_thread(self._mark_cancelled, batch, index)
            await asyncio.to_thread(channel.revoke, key)
            if lease.state == "done" or lease.slot not in slots:
                continue
            beat = await asyncio.to_thread(channel.heartbeat)
            reports = beat.shards if beat is not None and beat.state != "exited" else []
            if any(r.key == key and r.state == "running" for r in reports):
                stopped = False
        if stopped:  # every shard, so a grant racing this (never placed before) is refused too
            for index in _indexes(batch):
                prefix = keys.shard_prefix(batch.namespace, batch.uid, index)
                await asyncio.to_thread(fence_lease, self.store, keys.shard_lease_key(prefix))
        return stopped

    def _mark_cancelled(self, batch: BatchView, index: int) -> None:
        """The cancel mark beside a shard's results, before its take-back: the slot then lets
        the shard's requests in the engine finish (for the pool's ``cancelDrainSeconds``), where
        any other take-back cuts them after the short drain: a cancel lets running requests
        finish."""
        prefix = keys.shard_prefix(batch.namespace, batch.uid, index)
        with contextlib.suppress(ObjectExists):
            self.store.put(keys.shard_cancel_key(prefix), b"{}", if_absent=True)

    async def run(self, batch: BatchView, step: Step, now: float) -> None:
        if not await self._stop_shards(batch):
            step.again(now + recheck_seconds(batch, now))  # slots still flushing its shards
            return
        pool: BatchPoolSpec | None = await self.pool_of(batch.status.pool)
        merged = await self._merge(batch)
        await self._publish(batch, merged, pool, now)
        total = (batch.status.request_counts or RequestCounts()).total
        failed = total - merged.completed if merged.input_missing else merged.failed
        step.set(
            request_counts=RequestCounts(total=total, completed=merged.completed, failed=failed),
            usage=Usage(
                input_tokens=merged.input_tokens,
                cached_tokens=merged.cached_tokens,
                output_tokens=merged.output_tokens,
                reasoning_tokens=merged.reasoning_tokens,
                total_tokens=merged.total_tokens,
            ),
            output_file_id=_derived(batch, "output") if merged.output_key else None,
            error_file_id=_derived(batch, "errors") if merged.error_key else None,
        )
        await self._charge(batch, step, merged, pool, now)
        if merged.completed + failed != total:
            log.error("batch %s: %d + %d != %d", batch.name, merged.completed, failed, total)
        self._end(batch, step, merged, now, f"{merged.completed} completed, {failed} failed")
        metrics.count_finished_requests(merged.completed, merged.failed)
        metrics.TOKENS.labels("input").inc(merged.input_tokens)
        metrics.TOKENS.labels("output").inc(merged.output_tokens)

    def _never_run(self, batch: BatchView, shard: ShardStatus | None) -> tuple[str, str]:
        """(code, reason) of the error lines of a shard's requests that have no result."""
        if batch.status.status == Phase.CANCELLING:
            return "batch_cancelled", ""
        if batch.has_condition(BatchConditionType.EXPIRED):
            return "batch_expired", ""
        if batch.has_condition(BatchConditionType.POOL_DELETED):
            return "pool_deleted", f"pool {batch.status.pool} was deleted before this request ran"
        return "shard_failed", (shard.message if shard else None) or "the shard did not finish"

    async def _merge(self, batch: BatchView) -> MergedResults:
        outcomes = []
        listed = {s.index: s for s in batch.status.shards or []}
        for planned in await self._plan(batch):
            code, reason = self._never_run(batch, listed.get(planned.index))
            outcomes.append(
                ShardOutcome(
                    index=planned.index,
                    prefix=keys.shard_prefix(batch.namespace, batch.uid, planned.index),
                    start=planned.start,
                    end=planned.end,
                    first_line=planned.first_line,
                    never_run_code=code,
                    reason=reason,
                )
            )
        started = time.perf_counter()
        merged = await asyncio.to_thread(
            merge_shard_outputs,
            self.store,
            namespace=batch.namespace,
            batch_uid=batch.uid,
            input_key=batch.status.input_key or "",
            shards=outcomes,
            output_key=keys.file_key(batch.namespace, _derived(batch, "output")),
            error_key=keys.file_key(batch.namespace, _derived(batch, "errors")),
        )
        metrics.FINALIZE_SECONDS.observe(time.perf_counter() - started)
        return merged

    async def _publish(
        self, batch: BatchView, merged: MergedResults, pool: BatchPoolSpec | None, now: float
    ) -> None:
        """Create (or adopt) the output and error BatchFiles, owned by the Batch."""
        expires_at = output_expires_at(
            int(now),
            batch.spec.output_expires_after_seconds,
            pool.retention if pool is not None else None,
            self.config.retention,
        )
        for suffix, key, size, lines in (
            ("output", merged.output_key, merged.output_bytes, merged.completed),
            ("errors", merged.error_key, merged.error_bytes, merged.failed),
        ):
            if key is not None:
                file_id = _derived(batch, suffix)
                manifest = _result_file(batch, file_id, suffix, key, size, lines, now)
                manifest["spec"]["expiresAt"] = expires_at
                await self.kube.create_or_adopt_custom("batchfiles", batch.namespace, manifest)

    async def _charge(
        self,
        batch: BatchView,
        step: Step,
        merged: MergedResults,
        pool: BatchPoolSpec | None,
        now: float,
    ) -> None:
        """The batch's cost: GPU time on a GPUTime pool, else tokens at the fixed prices."""
        charges = batch.status.billing
        pricing = batch.status.pricing
        if charges is not None and charges.mode == "GPUTime":
            status = batch.status.model_copy(deep=True)
            busy = await busy_shares(self.store, batch.namespace, batch.uid, status)
            for shard in status.shards or []:  # shown per listed shard
                shard.run_seconds = max(shard.run_seconds, math.ceil(busy.get(shard.index, 0)))
            step.set(shards=status.shards)
            used, cost = charge_of(busy, status, pool, charges.gpu_hour_price)
            step.set(cost=cost, billing=charges.model_copy(update={"gpu_seconds": used}))
        elif pricing is not None:
            step.set(
                cost=cost_of(
                    merged.input_tokens,
                    merged.output_tokens,
                    pricing.input_per_million,
                    pricing.output_per_million,
                )
            )

    def _end(
        self, batch: BatchView, step: Step, merged: MergedResults, now: float, counts: str
    ) -> None:
        total = (batch.status.request_counts or RequestCounts()).total
        final, reason = Phase.COMPLETED, BatchEndReason.COMPLETED
        errors = []
        if batch.status.status == Phase.CANCELLING:
            final, reason = Phase.CANCELLED, BatchEndReason.CANCELLED
        elif batch.has_condition(BatchConditionType.EXPIRED):
            final, reason = Phase.EXPIRED, BatchEndReason.EXPIRED
        elif batch.has_condition(BatchConditionType.POOL_DELETED):
            final, reason = Phase.FAILED, BatchEndReason.POOL_DELETED
            errors.append(error("pool_deleted", f"Pool {batch.status.pool} was deleted."))
        if merged.input_missing:
            errors.append(error("input_file_deleted", merged.input_missing))
            step.event("InputFileDeleted", merged.input_missing, warning=True)
        if errors:
            step.set(errors=errors)
        if batch.status.status != Phase.FINALIZING or not batch.status.finalizing_at:
            step.set(finalizing_at=int(now))
        transition(step, batch, final, now, reason, f"{counts} of {total}")


def recheck_seconds(batch: BatchView, now: float) -> float:
    """How soon a stopping batch looks at its slots again."""
    since = batch.status.cancelling_at
    cancelling = batch.status.status == Phase.CANCELLING and since is not None
    if cancelling and since is not None and now - since >= CANCEL_RECHECK_AFTER_SECONDS:
        return CANCEL_RECHECK_SECONDS
    return FLUSH_RECHECK_SECONDS


def _derived(batch: BatchView, purpose: str) -> str:
    return keys.derived_file_id(batch.uid, purpose)


#: The component label of a batch's output and error BatchFiles.
RESULTS_COMPONENT = "batch-results"


def _result_file(
    batch: BatchView, file_id: str, suffix: str, key: str, size: int, lines: int, now: float
) -> dict[str, Any]:
    """The manifest of an output or error BatchFile, owned by its Batch."""
    manifest: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "BatchFile",
        "metadata": {
            "name": file_id,
            "namespace": batch.namespace,
            "labels": {
                LABEL_BATCH_UID: batch.uid,
                **labels.recommended_labels(
                    name=labels.PROJECT, instance=batch.name, component=RESULTS_COMPONENT
                ),
            },
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "Batch",
                    "name": batch.name,
                    "uid": batch.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "id": file_id,
            "bytes": size,
            "filename": f"{batch_id_from_name(batch.name)}_{suffix}.jsonl",
            "purpose": "batch_output",
            "storageKey": key,
            "lineCount": lines,
            "createdAt": int(now),
        },
    }
    return manifest


def _indexes(batch: BatchView) -> range | list[int]:
    return shardbook.shard_indexes(batch.status.shards, batch.status.shard_plan)
