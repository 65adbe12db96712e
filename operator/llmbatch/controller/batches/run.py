"""The ``in_progress`` phase: each unfinished shard's spec written for the pool scheduler to
place on a warm slot, each shard's lease (where it runs, whether it is done or given up) and
progress folded into the status, and the move to ``finalizing`` once every shard has finished."""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from llmbatch.api.resources import (
    BatchConditionType,
    BatchEndReason,
    BatchPoolSpec,
    Phase,
    RequestCounts,
    ShardStatus,
    Usage,
)
from llmbatch.api.shard import ModelRef, RequestRetries, ShardSpec
from llmbatch.api.slot import ShardLease
from llmbatch.controller.batches.deps import PhaseDeps
from llmbatch.controller.batches.step import BatchView, Step, set_condition, transition
from llmbatch.controller.jobs import engine_spec
from llmbatch.core import keys, shardbook
from llmbatch.core.admission import default_output_limit
from llmbatch.core.ids import batch_id_from_name, tenant_cache_salt
from llmbatch.core.scheduling import revision_to_serve
from llmbatch.core.shardbook import FINISHED
from llmbatch.core.tiers import tier_of
from llmbatch.core.validation.shards import ShardRange
from llmbatch.storage.shardresults import Progress, read_progress
from llmbatch.storage.slotchannel import read_lease

#: Stored plans held in memory (each a few KB; read again when dropped).
PLANS_HELD = 1024


@dataclass
class ShardRuns(PhaseDeps):
    """Runs the ``in_progress`` phase of one batch per call."""

    _last_progress: dict[str, float] = field(default_factory=dict, init=False)
    _plans: OrderedDict[str, list[ShardRange]] = field(default_factory=OrderedDict, init=False)
    _final: dict[str, dict[int, Progress]] = field(default_factory=dict, init=False)
    """Per running batch, the progress records of its finished shards (they change no more)."""

    def forget(self, uid: str) -> None:
        self._last_progress.pop(uid, None)
        self._plans.pop(uid, None)
        self._final.pop(uid, None)

    async def run(self, batch: BatchView, step: Step, now: float) -> None:
        pool_name = batch.status.pool or ""
        pool: BatchPoolSpec | None = await self.pool_of(pool_name)
        if pool is None:
            self._pool_gone(batch, step, now, pool_name)
            return
        shards = await self._working_shards(batch)
        # shards never granted (no lease) have no progress to read
        unplaced = {s.index for s in shards if not await self._track(batch, step, pool, s)}
        self._record(batch, step, shards)
        if all(s.phase in FINISHED for s in shards):
            await self._fold_progress(batch, step, shards, now, force=True)
            transition(
                step,
                batch,
                Phase.FINALIZING,
                now,
                "ShardsFinished",
                "Every shard finished; merging results",
            )
            return
        await self._fold_progress(batch, step, shards, now, unplaced=unplaced)
        if batch.status.expires_at:
            step.again(float(batch.status.expires_at))

    async def _working_shards(self, batch: BatchView) -> list[ShardStatus]:
        """The shards this step tracks: the listed ones, and those of a stored plan that wait
        unlisted (their ranges from the plan); a stored plan's succeeded shards are done with."""
        listed = [s.model_copy(deep=True) for s in batch.status.shards or []]
        plan = batch.status.shard_plan
        if plan is None:
            return listed
        succeeded = batch.status.succeeded_shards
        waiting = shardbook.unlisted_waiting(
            plan.count, (s.index for s in listed), succeeded.indexes if succeeded else ""
        )
        if not waiting:
            return listed
        ranges = await self._plan(batch.uid, plan.key)
        found = listed + [shardbook.waiting_shard(ranges[i]) for i in waiting]
        return sorted(found, key=lambda s: s.index)

    async def _plan(self, uid: str, key: str) -> list[ShardRange]:
        """A stored plan (it never changes: read once while its batch runs)."""
        plan = self._plans.get(uid)
        if plan is None:
            plan = shardbook.parse_plan(await asyncio.to_thread(self.store.get, key))
            self._plans[uid] = plan
            while len(self._plans) > PLANS_HELD:
                self._plans.popitem(last=False)
        self._plans.move_to_end(uid)
        return plan

    @staticmethod
    def _record(batch: BatchView, step: Step, shards: list[ShardStatus]) -> None:
        """The shards into the status patch where they changed (a stored plan's in its bounded
        form: :func:`llmbatch.core.shardbook.compact`)."""
        if batch.status.shard_plan is None:
            if shards != batch.status.shards:
                step.set(shards=shards)
            return
        listed, succeeded = shardbook.compact(shards, batch.status.succeeded_shards)
        if listed != (batch.status.shards or []):
            step.set(shards=listed)
        if succeeded != batch.status.succeeded_shards:
            step.set(succeeded_shards=succeeded)

    async def _track(
        self, batch: BatchView, step: Step, pool: BatchPoolSpec, shard: ShardStatus
    ) -> bool:
        """Queue the shard (its spec in the store) and fold its lease into its phase; False
        when it has no lease (never granted)."""
        if shard.phase in FINISHED:
            return True
        lease = await asyncio.to_thread(self._lease_or_queue, batch, pool, shard)
        if lease is None:
            shard.phase = "Pending"
            return False
        self._observe_lease(step, shard, lease)
        return True

    def _lease_or_queue(
        self, batch: BatchView, pool: BatchPoolSpec, shard: ShardStatus
    ) -> ShardLease | None:
        """The shard's lease; without one, its spec written for the pool scheduler to hand to a
        slot (once). Store calls only, in one call to a store thread: under a burst of new batches
        each call waits its turn on a busy event loop, three per shard of a batch just accepted."""
        prefix = keys.shard_prefix(batch.namespace, batch.uid, shard.index)
        lease = read_lease(self.store, keys.shard_lease_key(prefix))
        if lease is None:
            spec_key = keys.shard_spec_key(batch.namespace, batch.uid, shard.index)
            if self.store.head(spec_key) is None:
                spec = self._shard_spec(batch, pool, shard)
                self.store.put(spec_key, spec.model_dump_json().encode())
        return lease

    @staticmethod
    def _observe_lease(step: Step, shard: ShardStatus, lease: ShardLease) -> None:
        """Phase, slot, preemptions and re-runs of a shard from its lease."""
        shard.job = lease.slot or lease.ran_on or shard.job
        shard.preemptions = lease.preemptions
        if lease.attempts > shard.reruns:
            message = lease.message or "the shard's run ended early"
            if lease.state != "failed":
                reason = lease.reason or "ShardRetried"
                step.event(reason, f"{message}; re-running it", warning=True)
            shard.reruns = lease.attempts
        if lease.state == "done":
            shard.phase = "Succeeded"
        elif lease.state == "failed":
            shard.phase = "Failed"
            shard.message = (lease.message or "the shard did not finish")[:4096]
            step.event(
                "ShardFailed",
                f"Shard {shard.index} failed; its unfinished requests become shard_failed "
                f"error lines: {shard.message}"[:1024],
                warning=True,
            )
        else:
            shard.phase = "Running" if lease.state == "granted" else "Pending"

    def _shard_spec(self, batch: BatchView, pool: BatchPoolSpec, shard: ShardStatus) -> ShardSpec:
        model = next(m for m in pool.models if m.name == batch.status.model)
        return ShardSpec(
            batch_id=batch_id_from_name(batch.name),
            batch_uid=batch.uid,
            shard_index=shard.index,
            endpoint=batch.spec.endpoint,
            tier=tier_of(batch.spec.priority, batch.spec.metadata),
            cache_salt=tenant_cache_salt(batch.namespace),
            store=self.config.executor_store_uri,
            input_key=batch.status.input_key or "",
            start=shard.start,
            end=shard.end,
            first_line=shard.first_line,
            output_prefix=keys.shard_prefix(batch.namespace, batch.uid, shard.index),
            # The revision pinned at acceptance, not the pool's current one.
            model=ModelRef(
                name=model.name,
                path=model.source,
                revision=revision_to_serve(batch.status.model_revision, model.revision),
            ),
            engine=engine_spec(self.config, pool),
            flush_lines=pool.executor.flush_lines,
            flush_seconds=pool.executor.flush_seconds,
            drain_seconds=max(1, pool.executor.termination_grace_seconds - 5),
            cancel_drain_seconds=pool.executor.cancel_drain_seconds,
            default_output_tokens=default_output_limit(pool),
            retries=RequestRetries(
                max_attempts=pool.retries.max_attempts,
                backoff_seconds=pool.retries.backoff_milliseconds / 1000,
                max_backoff_seconds=pool.retries.max_backoff_milliseconds / 1000,
            ),
        )

    def _pool_gone(self, batch: BatchView, step: Step, now: float, pool: str) -> None:
        """The pool was deleted under a running batch: stop, keep what finished, end failed."""
        message = f"Pool {pool} was deleted while the batch ran; its requests that had not run fail"
        transition(step, batch, Phase.FINALIZING, now, "PoolDeleted", message)
        gone = BatchConditionType.POOL_DELETED
        set_condition(step, batch, gone, True, BatchEndReason.POOL_DELETED, message, now)
        step.events[-1] = ("Warning", "PoolDeleted", message)

    async def _fold_progress(
        self,
        batch: BatchView,
        step: Step,
        shards: list[ShardStatus],
        now: float,
        *,
        force: bool = False,
        unplaced: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        """Fold the shards' progress records into the counts and usage (throttled); the
        ``unplaced`` shards were never granted, so have none."""
        last = self._last_progress.get(batch.uid, 0.0)
        if not force and now - last < self.config.progress_interval:
            step.again(last + self.config.progress_interval)
            return
        self._last_progress[batch.uid] = now
        counts = RequestCounts(total=(batch.status.request_counts or RequestCounts()).total)
        usage = Usage()
        tracked = {s.index: s for s in shards}
        final = self._final.setdefault(batch.uid, {})
        for index in shardbook.shard_indexes(batch.status.shards, batch.status.shard_plan):
            shard = tracked.get(index)  # None: a stored plan's succeeded shard, folded
            progress = final.get(index)
            if progress is None:
                if index in unplaced:
                    continue
                prefix = keys.shard_prefix(batch.namespace, batch.uid, index)
                progress = await asyncio.to_thread(read_progress, self.store, prefix)
                if progress is None:
                    continue
                if progress.done and (shard is None or shard.phase in FINISHED):
                    final[index] = progress  # read once: a finished shard's record is final
            if shard is not None:
                shard.completed, shard.failed = progress.completed, progress.failed
                # GPU time: the shard's share of its slots' busy time (docs/billing.md).
                shard.run_seconds = math.ceil(progress.busy_seconds)
            counts.completed += progress.completed
            counts.failed += progress.failed
            usage.input_tokens += progress.input_tokens
            usage.output_tokens += progress.output_tokens
            usage.total_tokens += progress.total_tokens
            usage.cached_tokens += progress.cached_tokens
            usage.reasoning_tokens += progress.reasoning_tokens
        if counts != batch.status.request_counts:
            step.set(request_counts=counts)
        old = batch.status.usage or Usage()
        if usage != old or batch.status.usage is None:
            step.set(usage=usage)
        self._record(batch, step, shards)
