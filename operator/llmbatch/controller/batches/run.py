"""The ``in_progress`` phase: one suspended Job per unfinished shard (the pool scheduler admits
them), each Job's state folded into its shard, progress folded into the counts, and the move to
``finalizing`` once every shard has finished."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import yaml

from llmbatch.api.resources import BatchPoolSpec, Phase, RequestCounts, ShardStatus, Usage
from llmbatch.api.shard import EngineSpec, ModelRef, ShardSpec
from llmbatch.controller import metrics
from llmbatch.controller.batches.deps import PhaseDeps
from llmbatch.controller.batches.jobstate import needs_pods, observe_job
from llmbatch.controller.batches.step import BatchView, Step, set_condition, transition
from llmbatch.controller.jobs import LABEL_BATCH_UID, build_shard_job
from llmbatch.core import keys, tiers
from llmbatch.core.ids import batch_id_from_name, shard_job_name
from llmbatch.storage.shardresults import read_progress

#: Re-runs of a shard whose Job succeeded without a result for every request (then: Failed).
MAX_RERUNS = 2
FINISHED = ("Succeeded", "Failed")


def engine_args(pool: BatchPoolSpec) -> dict[str, Any]:
    """``--max-num-seqs=64`` style pool arguments as the executor's ``{max_num_seqs: 64}``."""
    args: dict[str, Any] = {}
    for item in pool.executor.engine_args or []:
        name, _, value = item.lstrip("-").partition("=")
        args[name.replace("-", "_")] = yaml.safe_load(value) if value else True
    return args


@dataclass
class ShardRuns(PhaseDeps):
    """Runs the ``in_progress`` phase of one batch per call."""

    _last_progress: dict[str, float] = field(default_factory=dict, init=False)

    def forget(self, uid: str) -> None:
        self._last_progress.pop(uid, None)

    async def run(self, batch: BatchView, step: Step, now: float) -> None:
        pool_name = batch.status.pool or ""
        pool: BatchPoolSpec | None = await self.pool_of(pool_name)
        if pool is None:
            self._pool_gone(batch, step, now, pool_name)
            return
        shards = [s.model_copy(deep=True) for s in batch.status.shards or []]
        selector = f"{LABEL_BATCH_UID}={batch.uid}"
        jobs = {
            job["metadata"]["name"]: job
            for job in await self.kube.list_jobs(pool.worker_namespace, selector)
        }
        pods = await self._pods_to_read(pool.worker_namespace, selector, shards, jobs, batch.uid)
        for shard in shards:
            await self._track(batch, step, now, pool_name, pool, shard, jobs, pods)
        if shards != batch.status.shards:
            step.set(shards=shards)
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
        await self._fold_progress(batch, step, shards, now)

    async def _track(
        self,
        batch: BatchView,
        step: Step,
        now: float,
        pool_name: str,
        pool: BatchPoolSpec,
        shard: ShardStatus,
        jobs: dict[str, dict[str, Any]],
        pods: list[dict[str, Any]],
    ) -> None:
        """Create the shard's Job when it has none, then fold the Job's state into it."""
        job = jobs.get(shard_job_name(batch.uid, shard.index, shard.reruns))
        if job is None and shard.phase not in FINISHED:
            job = await self._create_job(batch, pool_name, pool, shard)
            shard.job = job["metadata"]["name"]
        if job is None:
            return
        before = shard.phase
        observe_job(shard, job, pods, pool_name, now)
        if shard.phase == "Succeeded" and before != "Succeeded":
            await self._check_covered(batch, step, shard, pool.worker_namespace)
        if shard.phase == "Failed" and before != "Failed":
            message = shard.message or "the shard did not finish"
            step.event(
                "ShardFailed",
                f"Shard {shard.index} failed; its unfinished requests become shard_failed "
                f"error lines: {message}"[:1024],
                warning=True,
            )

    async def _pods_to_read(
        self,
        namespace: str,
        selector: str,
        shards: list[ShardStatus],
        jobs: dict[str, dict[str, Any]],
        uid: str,
    ) -> list[dict[str, Any]]:
        """The batch's pods, listed only when a Job's run start is not yet known (GPU time
        starts when the executor runs, not when its pod waits for a node)."""
        for shard in shards:
            job = jobs.get(shard_job_name(uid, shard.index, shard.reruns))
            if job is not None and needs_pods(shard, job):
                return await self.kube.list_pods(namespace, selector)
        return []

    async def _create_job(
        self, batch: BatchView, pool_name: str, pool: BatchPoolSpec, shard: ShardStatus
    ) -> dict[str, Any]:
        spec_key = keys.shard_spec_key(batch.namespace, batch.uid, shard.index)
        shard_spec = self._shard_spec(batch, pool, shard)
        await asyncio.to_thread(self.store.put, spec_key, shard_spec.model_dump_json().encode())
        return await self.kube.create_or_adopt_job(
            build_shard_job(
                config=self.config,
                pool_name=pool_name,
                pool=pool,
                batch_namespace=batch.namespace,
                batch_name=batch.name,
                batch_uid=batch.uid,
                tier=tiers.tier_of(batch.spec.priority, batch.spec.metadata),
                created_at=batch.status.created_at or batch.created,
                shard_index=shard.index,
                shard_requests=shard.request_count,
                spec_key=spec_key,
                rerun=shard.reruns,
            )
        )

    def _shard_spec(self, batch: BatchView, pool: BatchPoolSpec, shard: ShardStatus) -> ShardSpec:
        model = next(m for m in pool.models if m.name == batch.status.model)
        return ShardSpec(
            batch_id=batch_id_from_name(batch.name),
            batch_uid=batch.uid,
            shard_index=shard.index,
            endpoint=batch.spec.endpoint,
            store=self.config.executor_store_uri,
            input_key=batch.status.input_key or "",
            start=shard.start,
            end=shard.end,
            first_line=shard.first_line,
            output_prefix=keys.shard_prefix(batch.namespace, batch.uid, shard.index),
            model=ModelRef(name=model.name, path=model.source),
            engine=EngineSpec(name=pool.executor.engine, args=engine_args(pool)),
            flush_lines=pool.executor.flush_lines,
            flush_seconds=pool.executor.flush_seconds,
            drain_seconds=max(1, pool.executor.termination_grace_seconds - 5),
        )

    def _pool_gone(self, batch: BatchView, step: Step, now: float, pool: str) -> None:
        """The pool was deleted under a running batch: stop, keep what finished, end failed."""
        message = f"Pool {pool} was deleted while the batch ran; its requests that had not run fail"
        transition(step, batch, Phase.FINALIZING, now, "PoolDeleted", message)
        set_condition(step, batch, "PoolDeleted", True, "PoolDeleted", message, now)
        step.events[-1] = ("Warning", "PoolDeleted", message)

    async def _check_covered(
        self, batch: BatchView, step: Step, shard: ShardStatus, worker_namespace: str
    ) -> None:
        """A shard whose Job succeeded must have a result for every request of its range.

        A run that exits 0 without them breaks the executor's contract (a lost commit): rather
        than turn those requests into ``shard_failed`` lines, re-run the shard (resuming from
        its chunks) in a Job of its own, at most :data:`MAX_RERUNS` times.
        """
        prefix = keys.shard_prefix(batch.namespace, batch.uid, shard.index)
        progress = await asyncio.to_thread(read_progress, self.store, prefix)
        covered = 0 if progress is None else progress.completed + progress.failed
        missing = shard.request_count - covered
        done = progress is not None and progress.done
        if done and missing <= 0:
            return
        metrics.SHARD_INCOMPLETE.inc()
        message = (
            f"Shard {shard.index} succeeded with {max(missing, 0)} of its "
            f"{shard.request_count} requests without a result (done={done})"
        )
        if shard.reruns >= MAX_RERUNS:
            shard.phase = "Failed"
            shard.message = f"{message}; gave up after {shard.reruns} re-runs"
            step.event("ShardIncomplete", shard.message, warning=True)
            return
        if shard.job:
            await self.kube.delete_job(worker_namespace, shard.job)
        shard.job = None
        shard.reruns += 1
        shard.phase = "Pending"
        step.event("ShardIncomplete", f"{message}; re-running it", warning=True)

    async def _fold_progress(
        self,
        batch: BatchView,
        step: Step,
        shards: list[ShardStatus],
        now: float,
        *,
        force: bool = False,
    ) -> None:
        """Fold the shards' progress records into the counts and usage (throttled)."""
        last = self._last_progress.get(batch.uid, 0.0)
        if not force and now - last < self.config.progress_interval:
            return
        self._last_progress[batch.uid] = now
        counts = RequestCounts(total=(batch.status.request_counts or RequestCounts()).total)
        usage = Usage()
        for shard in shards:
            prefix = keys.shard_prefix(batch.namespace, batch.uid, shard.index)
            progress = await asyncio.to_thread(read_progress, self.store, prefix)
            if progress is None:
                continue
            shard.completed, shard.failed = progress.completed, progress.failed
            counts.completed += progress.completed
            counts.failed += progress.failed
            usage.input_tokens += progress.input_tokens
            usage.output_tokens += progress.output_tokens
            usage.total_tokens += progress.total_tokens
        if counts != batch.status.request_counts:
            step.set(request_counts=counts)
        old = batch.status.usage or Usage()
        if (usage.input_tokens, usage.output_tokens, usage.total_tokens) != (
            old.input_tokens,
            old.output_tokens,
            old.total_tokens,
        ) or batch.status.usage is None:
            step.set(usage=usage)
        if shards != batch.status.shards:
            step.set(shards=shards)
