"""GPU time starts when the executor runs on its node, never while its pod waits (seed 000).

``llmbatch.controller.batches.jobstate`` folds a shard's Job and its pods into the shard status;
these tests play the Job controller and the kubelet with plain objects.
"""

from __future__ import annotations

from typing import Any

from llmbatch.api.resources import ShardStatus
from llmbatch.controller.batches.jobstate import executor_started, needs_pods, observe_job
from tests.fixtures.reconciler import stamp

T0 = 1_800_000_000
JOB_UID = "job-uid-1"


def shard() -> ShardStatus:
    return ShardStatus(index=0, start=0, end=10, first_line=1, line_count=1, request_count=1)


def job(started: int | None, *, suspend: bool = False, finished: int | None = None) -> Any:
    status: dict[str, Any] = {}
    if started is not None:
        status["startTime"] = stamp(started)
        status["active"] = 1
    if finished is not None:
        status = {
            "startTime": stamp(started or T0),
            "completionTime": stamp(finished),
            "succeeded": 1,
            "conditions": [
                {"type": "Complete", "status": "True", "lastTransitionTime": stamp(finished)}
            ],
        }
    return {
        "metadata": {"name": "job-0", "uid": JOB_UID},
        "spec": {"suspend": suspend},
        "status": status,
    }


def pod(
    *,
    running: int | None = None,
    terminated: int | None = None,
    owner: str = JOB_UID,
    deleting: bool = False,
) -> Any:
    state: dict[str, Any] = {"waiting": {"reason": "ContainerCreating"}}
    if running is not None:
        state = {"running": {"startedAt": stamp(running)}}
    if terminated is not None:
        state = {"terminated": {"startedAt": stamp(terminated), "exitCode": 0}}
    meta: dict[str, Any] = {"name": "p", "ownerReferences": [{"kind": "Job", "uid": owner}]}
    if deleting:
        meta["deletionTimestamp"] = stamp(T0)
    status = {"phase": "Running", "containerStatuses": [{"name": "executor", "state": state}]}
    return {"metadata": meta, "status": status}


UNSCHEDULED = {
    "metadata": {"name": "p", "ownerReferences": [{"kind": "Job", "uid": JOB_UID}]},
    "status": {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
    },
}


def test_an_unscheduled_pod_opens_no_run() -> None:
    s = shard()
    for now in (T0 + 10, T0 + 600):
        observe_job(s, job(T0), [UNSCHEDULED], "pool", now)
        assert (s.run_seconds, s.running_since) == (0, None)
    assert s.phase == "Running"  # the Job has an active pod; billing is what waits


def test_the_run_opens_when_the_executor_container_starts() -> None:
    s = shard()
    observe_job(s, job(T0), [UNSCHEDULED], "pool", T0 + 300)
    observe_job(s, job(T0), [pod(running=T0 + 400)], "pool", T0 + 401)
    assert s.running_since == T0 + 400
    assert not needs_pods(s, job(T0))  # an open, current run needs no pod list
    observe_job(s, job(None, finished=T0 + 460), [], "pool", T0 + 470)
    assert (s.run_seconds, s.running_since) == (60, None)


def test_a_run_seen_only_after_it_finished_counts_from_its_container_start() -> None:
    s = shard()
    observe_job(s, job(T0, finished=T0 + 500), [pod(terminated=T0 + 450)], "pool", T0 + 501)
    assert (s.phase, s.run_seconds) == ("Succeeded", 50)


def test_a_job_that_never_ran_a_pod_is_charged_nothing() -> None:
    s = shard()
    observe_job(s, job(T0), [UNSCHEDULED], "pool", T0 + 60)
    observe_job(s, job(None, suspend=True), [], "pool", T0 + 120)  # a cancel / preemption
    assert (s.run_seconds, s.running_since) == (0, None)


def test_only_the_jobs_current_pods_count() -> None:
    assert executor_started(job(T0), [pod(running=T0 + 5, owner="other")]) is None
    assert executor_started(job(T0), [pod(running=T0 + 5, deleting=True)]) is None
    # a pod of the run before a suspension (the Job's startTime was reset on resume)
    assert executor_started(job(T0 + 100), [pod(running=T0 + 5)]) is None
    assert executor_started(job(T0), [pod(running=T0 + 9), pod(terminated=T0 + 7)]) == T0 + 7
    assert executor_started(job(None), [pod(running=T0)]) is None


def test_a_missed_suspension_and_resume_closes_the_old_run_at_the_resume() -> None:
    s = shard()
    observe_job(s, job(T0), [pod(running=T0 + 10)], "pool", T0 + 11)
    # suspended and resumed between two looks: the new pod waits for a node
    resumed = job(T0 + 100)
    assert needs_pods(s, resumed)
    observe_job(s, resumed, [UNSCHEDULED], "pool", T0 + 200)
    assert (s.run_seconds, s.running_since) == (90, None)
    observe_job(s, resumed, [pod(running=T0 + 250)], "pool", T0 + 251)
    assert (s.run_seconds, s.running_since) == (90, T0 + 250)
