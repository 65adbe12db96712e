"""The pool scheduler: sizes a pool and grants its slots to the head of its queue.

Level-based, all state on the Jobs and the pool status: a suspended shard Job is waiting, an
unsuspended unfinished one holds a slot. Each round it learns throughput from newly finished
shards, computes the desired slot count from the backlog (``core.autoscaling``), orders the
waiting shards (``core.scheduling``) and unsuspends as many as the desired count leaves room for.
Pods that cannot be placed yet stay Pending, which is the cluster autoscaler's cue to add GPU
nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.controller import metrics
from llmbatch.controller.jobs import (
    ANNOTATION_BATCH,
    ANNOTATION_CREATED,
    ANNOTATION_PREEMPTIONS,
    ANNOTATION_REQUESTS,
    ANNOTATION_TIER,
    LABEL_POOL,
    LABEL_SHARD,
)
from llmbatch.controller.kube import Kube
from llmbatch.core.autoscaling import ScaleState, damp, learn_throughput, raw_desired_slots
from llmbatch.core.lifecycle import unix_seconds
from llmbatch.core.scheduling import QueuedShard, grant_slots
from llmbatch.core.tiers import TIER_RANK, TIERS

ANNOTATION_LEARNED = "llmbatch.io/throughput-learned"


def _condition(job: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def _finished(job: dict[str, Any]) -> bool:
    return _condition(job, "Complete") or _condition(job, "Failed")


def _queued(job: dict[str, Any]) -> QueuedShard:
    meta = job["metadata"]
    annotations = meta.get("annotations") or {}
    return QueuedShard(
        batch=annotations.get(ANNOTATION_BATCH, meta["name"]),
        tier=annotations.get(ANNOTATION_TIER, "standard"),
        created_at=float(annotations.get(ANNOTATION_CREATED, "0")),
        shard_index=int((meta.get("labels") or {}).get(LABEL_SHARD, "0")),
        requests=int(annotations.get(ANNOTATION_REQUESTS, "0")),
    )


def _backlog(jobs: list[dict[str, Any]]) -> dict[str, int]:
    """Requests of the unfinished shard Jobs per tier (an unknown tier counts as standard)."""
    backlog: dict[str, int] = dict.fromkeys(TIERS, 0)
    for job in jobs:
        shard = _queued(job)
        backlog[shard.tier if shard.tier in backlog else "standard"] += shard.requests
    return backlog


def _scale(
    pool: BatchPoolSpec,
    backlog: dict[str, int],
    throughput: float,
    status: dict[str, Any],
    now: float,
) -> tuple[ScaleState, ScaleState]:
    """The previous and the new desired slot count (scale-down damped by the cool-down)."""
    drain: dict[str, int] = {t: getattr(pool.tiers, t).drain_target_seconds for t in TIERS}
    raw = raw_desired_slots(backlog, throughput, drain, pool.min_slots, pool.max_slots)
    previous = ScaleState(
        desired=int(status.get("desiredSlots", pool.min_slots)),
        below_since=status.get("scaleDownSince"),
    )
    return previous, damp(previous, raw, now, pool.scale_down_cooldown_seconds)


def _export_metrics(
    name: str,
    in_use: int,
    desired: int,
    queued: list[tuple[dict[str, Any], QueuedShard]],
    chosen: set[int],
) -> None:
    metrics.JOBS_RUNNING.labels(name).set(in_use)
    metrics.DESIRED_SLOTS.labels(name).set(desired)
    for tier in TIERS:
        metrics.QUEUE_DEPTH.labels(name, tier).set(
            sum(1 for _, q in queued if q.tier == tier and id(q) not in chosen)
        )


@dataclass
class PoolRound:
    """The status patch and Events of one scheduling round."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)


class PoolScheduler:
    """One scheduling round per call, per pool."""

    def __init__(self, kube: Kube, clock: Any = time.time) -> None:
        self.kube = kube
        self.clock = clock

    async def step(self, name: str, spec: dict[str, Any], status: dict[str, Any]) -> PoolRound:
        """One round: learn throughput, size the pool, grant slots (and preempt for them)."""
        pool = BatchPoolSpec.model_validate(spec)
        namespace = pool.worker_namespace
        now = self.clock()
        result = PoolRound()
        all_jobs = await self.kube.list_jobs(namespace, f"{LABEL_POOL}={name}")
        throughput = float(Decimal(status.get("throughputPerSlot") or pool.throughput_per_slot))
        throughput = await self._learn_throughput(namespace, all_jobs, throughput)

        jobs = [
            j for j in all_jobs if not j["metadata"].get("deletionTimestamp") and not _finished(j)
        ]
        running = [j for j in jobs if not (j.get("spec") or {}).get("suspend")]
        waiting = [j for j in jobs if (j.get("spec") or {}).get("suspend")]
        backlog = _backlog(jobs)
        previous, scaled = _scale(pool, backlog, throughput, status, now)
        if scaled.desired != previous.desired:
            result.events.append(
                (
                    "Normal",
                    "DesiredSlots",
                    f"Desired slots {previous.desired} → {scaled.desired} (backlog {backlog})",
                )
            )

        queued = [(job, _queued(job)) for job in waiting]
        granted = grant_slots((q for _, q in queued), len(running), scaled.desired)
        chosen = {id(q) for q in granted}
        for job, shard in queued:
            if id(shard) in chosen:
                await self.kube.set_job_suspended(namespace, job["metadata"]["name"], False)

        preempted = 0
        if pool.preemption == "LowerPriority":
            preempted = await self._preempt(pool, namespace, running, queued, chosen, result)
        in_use = len(running) + len(granted) - preempted
        _export_metrics(name, in_use, scaled.desired, queued, chosen)
        drain: dict[str, int] = {t: getattr(pool.tiers, t).drain_target_seconds for t in TIERS}
        metrics.observe_pool(name, backlog, drain, pool.max_slots, throughput)
        wanted = {
            "slotsInUse": in_use,
            "desiredSlots": scaled.desired,
            "queueDepth": backlog,
            "throughputPerSlot": f"{throughput:.4f}",
            "scaleDownSince": int(scaled.below_since) if scaled.below_since is not None else None,
        }
        result.status = {k: v for k, v in wanted.items() if status.get(k) != v}
        return result

    async def _learn_throughput(
        self, namespace: str, jobs: list[dict[str, Any]], throughput: float
    ) -> float:
        """Fold each newly completed Job's rate into ``throughput``; mark the Job as learned."""
        for job in jobs:
            annotations = job["metadata"].get("annotations") or {}
            job_status = job.get("status") or {}
            if (
                _condition(job, "Complete")
                and ANNOTATION_LEARNED not in annotations
                and job_status.get("startTime")
                and job_status.get("completionTime")
            ):
                seconds = unix_seconds(job_status["completionTime"]) - unix_seconds(
                    job_status["startTime"]
                )
                throughput = learn_throughput(
                    throughput, int(annotations.get(ANNOTATION_REQUESTS, "0")), max(1, seconds)
                )
                await self.kube.annotate_job(
                    namespace, job["metadata"]["name"], {ANNOTATION_LEARNED: "true"}
                )
        return throughput

    async def _preempt(
        self,
        pool: BatchPoolSpec,
        namespace: str,
        running: list[dict[str, Any]],
        queued: list[tuple[dict[str, Any], QueuedShard]],
        chosen: set[int],
        result: PoolRound,
    ) -> int:
        """Suspend lower-tier running shards for expedited shards still waiting.

        A suspended Job's pod gets SIGTERM, the executor commits what finished and exits with
        its preemption code (ignored by the Job's podFailurePolicy); the shard waits in the
        queue and later resumes without redoing work. A shard is preempted at most
        ``maxPreemptionsPerShard`` times, so nothing is requeued forever.
        """
        starving = sum(1 for _, q in queued if q.tier == "expedited" and id(q) not in chosen)
        if not starving:
            return 0
        victims = []
        for job in running:
            shard = _queued(job)
            count = int((job["metadata"].get("annotations") or {}).get(ANNOTATION_PREEMPTIONS, "0"))
            if shard.tier != "expedited" and count < pool.max_preemptions_per_shard:
                victims.append((TIER_RANK.get(shard.tier, 9), shard.created_at, job, count))
        # Lowest tier first; within a tier the newest batch, which loses the least progress.
        victims.sort(key=lambda v: (-v[0], -v[1]))
        for _, _, job, count in victims[:starving]:
            job_name = job["metadata"]["name"]
            await self.kube.annotate_job(
                namespace, job_name, {ANNOTATION_PREEMPTIONS: str(count + 1)}
            )
            await self.kube.set_job_suspended(namespace, job_name, True)
            result.events.append(
                ("Normal", "Preempted", f"Suspended shard Job {job_name} for expedited work")
            )
        return min(starving, len(victims))
