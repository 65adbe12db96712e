"""What a shard's Job says: finished or not, when it ran, and the GPU time its runs used."""

from __future__ import annotations

from typing import Any, Literal

from llmbatch.api.resources import BatchPoolSpec, BatchStatus, ShardStatus
from llmbatch.controller import metrics
from llmbatch.controller.jobs import ANNOTATION_PREEMPTIONS
from llmbatch.core import billing
from llmbatch.core.lifecycle import unix_seconds

Finished = Literal["Succeeded", "Failed"]


def job_finished(job: dict[str, Any]) -> tuple[Finished | None, str]:
    """("Succeeded" | "Failed" | None, the failure message) from the Job's conditions."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Succeeded", ""
        if cond.get("type") == "Failed":
            return "Failed", cond.get("message") or cond.get("reason") or "Job failed"
    return None, ""


def _stamp(value: str | None) -> int | None:
    return unix_seconds(value) if value else None


def finished_at(job: dict[str, Any]) -> int | None:
    """When a finished Job ended: its completionTime, else its Complete/Failed condition's."""
    job_status = job.get("status") or {}
    if job_status.get("completionTime"):
        return unix_seconds(job_status["completionTime"])
    for cond in job_status.get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return _stamp(cond.get("lastTransitionTime"))
    return None


def _track_run(
    shard: ShardStatus, started: int | None, ended: int | None, active: bool, now: float
) -> None:
    shard.run_seconds, shard.running_since = billing.observe_run(
        shard.run_seconds,
        shard.running_since,
        started=started,
        finished_at=ended,
        active=active,
        now=int(now),
    )


def observe_job(shard: ShardStatus, job: dict[str, Any], pool_name: str, now: float) -> None:
    """Fold the Job's state into ``shard``: phase, failure message, preemptions, run time."""
    shard.job = job["metadata"]["name"]
    finished, message = job_finished(job)
    job_status = job.get("status") or {}
    started = _stamp(job_status.get("startTime"))
    if finished is not None:
        if shard.phase != finished:
            start, end = job_status.get("startTime"), job_status.get("completionTime")
            if start and end:
                seconds = unix_seconds(end) - unix_seconds(start)
                metrics.SHARD_RUN_SECONDS.labels(pool_name).observe(seconds)
            _track_run(shard, started, finished_at(job) or int(now), False, now)
        shard.phase = finished
        if message:
            shard.message = message[:4096]
        return
    annotations = job["metadata"].get("annotations") or {}
    shard.preemptions = int(annotations.get(ANNOTATION_PREEMPTIONS, "0"))
    suspended = (job.get("spec") or {}).get("suspend")
    active = job_status.get("active") or 0
    shard.phase = "Pending" if suspended else ("Running" if active else "Admitted")
    _track_run(shard, started, None, not suspended, now)


def gpu_seconds(status: BatchStatus, gpus: int, now: float) -> int:
    """GPU-seconds of a batch's shards; runs still open (stopped by a cancel) end ``now``."""
    total = 0
    for shard in status.shards or []:
        run, _ = billing.observe_run(
            shard.run_seconds,
            shard.running_since,
            started=None,
            finished_at=None,
            active=False,
            now=int(now),
        )
        total += run
    return total * gpus


def gpu_time_charge(
    status: BatchStatus, pool: BatchPoolSpec | None, gpu_hour_price: str | None, now: float
) -> tuple[int, str]:
    """(GPU-seconds used, their cost) of a batch on a GPUTime pool, runs still open ending now."""
    used = gpu_seconds(status, gpus_per_slot(status, pool), now)
    charge = billing.final_charge(
        "GPUTime",
        pricing=None,
        input_tokens=0,
        output_tokens=0,
        gpu_seconds=used,
        gpu_hour_price=gpu_hour_price,
    )
    return used, charge


def gpus_per_slot(status: BatchStatus, pool: BatchPoolSpec | None) -> int:
    """GPUs per shard pod: recorded at acceptance, else the pool's (older batches), else 1."""
    if status.gpus_per_slot is not None:
        return status.gpus_per_slot
    return pool.gpus_per_slot if pool is not None else 1
