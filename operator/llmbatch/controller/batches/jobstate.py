"""What a shard's Job says: finished or not, when it ran, and the GPU time its runs used.

A run is billed from when the executor container started on its node (the pod's
``state.running.startedAt`` / ``state.terminated.startedAt``), never from the Job's
``startTime``: that is when the pod was created, and a pod waiting to be scheduled (no node fits,
a node scaling up) or pulling its image holds no GPU yet (seed 000: queue time has no GPU
charge).
"""

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


def executor_started(job: dict[str, Any], pods: list[dict[str, Any]]) -> int | None:
    """When the Job's current run began executing: the earliest container start among its pods.

    Only pods of this Job (by owner uid) that are not being deleted and that started no earlier
    than the Job's ``startTime`` count: a pod of a run before a suspension (still terminating)
    is not the current run. None while no pod of the run has started (unscheduled, pulling).
    """
    job_start = _stamp((job.get("status") or {}).get("startTime"))
    if job_start is None:
        return None
    uid = job["metadata"].get("uid")
    starts = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        owners = meta.get("ownerReferences") or []
        if meta.get("deletionTimestamp") or not any(o.get("uid") == uid for o in owners):
            continue
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            for state in (container.get("state"), container.get("lastState")):
                for kind in ("running", "terminated"):
                    started = _stamp(((state or {}).get(kind) or {}).get("startedAt"))
                    if started is not None and started >= job_start:
                        starts.append(started)
    return min(starts) if starts else None


def needs_pods(shard: ShardStatus, job: dict[str, Any]) -> bool:
    """Whether folding ``job`` into ``shard`` needs its pods (when its current run began).

    A shard whose run is open and current (no resume since) needs nothing more; neither does a
    suspended Job or one whose end was already folded.
    """
    if shard.phase in ("Succeeded", "Failed") or (job.get("spec") or {}).get("suspend"):
        return False
    job_start = _stamp((job.get("status") or {}).get("startTime"))
    if job_start is None:
        return False
    return shard.running_since is None or job_start > shard.running_since


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


def _close_missed_run(shard: ShardStatus, job_start: int | None) -> None:
    """A suspension and a resume both fell between two looks: end the earlier run at the resume.

    (Kubernetes resets a Job's ``startTime`` when it resumes.) The new run then opens when its
    pod starts, so the new pod's wait for a node is not billed either.
    """
    if (
        job_start is not None
        and shard.running_since is not None
        and job_start > shard.running_since
    ):
        shard.run_seconds += job_start - shard.running_since
        shard.running_since = None


def observe_job(
    shard: ShardStatus,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    pool_name: str,
    now: float,
) -> None:
    """Fold the Job's state into ``shard``: phase, failure message, preemptions, run time.

    ``pods`` are the Job's pods when :func:`needs_pods` says they matter (else ``[]``).
    """
    shard.job = job["metadata"]["name"]
    finished, message = job_finished(job)
    job_status = job.get("status") or {}
    fetched = needs_pods(shard, job)
    if fetched:
        _close_missed_run(shard, _stamp(job_status.get("startTime")))
    started = executor_started(job, pods) if fetched else None
    if finished is not None:
        if shard.phase != finished:
            begin = started if shard.running_since is None else shard.running_since
            end = finished_at(job)
            if begin is not None and end is not None:
                metrics.SHARD_RUN_SECONDS.labels(pool_name).observe(end - begin)
            _track_run(shard, started, end or int(now), False, now)
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
