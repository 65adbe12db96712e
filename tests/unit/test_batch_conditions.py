"""A Batch's conditions follow the conventions tools read: ``Complete`` / ``Failed`` (the Job
controller's, what ``kubectl wait --for=condition=...`` waits on) and ``Reconciling`` /
``Stalled`` (kstatus: Flux, Argo CD). A failed, expired or cancelled batch is never reported as
ready or complete, and the old ``Ready`` condition goes."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from llmbatch.api.resources import BatchEndReason, Phase
from llmbatch.controller.batches.step import BatchView, Step, error, transition
from llmbatch.controller.batches.validate import fail
from llmbatch.core.lifecycle import phase_conditions, rfc3339
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"
NOW = 1_800_000_100
BEFORE = 1_800_000_010


def view(phase: str, generation: int = 1, **status: Any) -> BatchView:
    """A batch in ``phase`` that entered it at ``BEFORE`` (``Reconciling=True``, and the
    ``Ready=False`` an older operator wrote)."""
    conditions = [
        {"type": "Ready", "status": "False", "reason": "Validating", "message": "old",
         "lastTransitionTime": rfc3339(BEFORE)},
        {"type": "Reconciling", "status": "True", "reason": "Validated", "message": "running",
         "lastTransitionTime": rfc3339(BEFORE)},
    ]  # fmt: skip
    return BatchView.parse(
        {
            "metadata": {
                "namespace": TENANT,
                "name": BATCH,
                "uid": "uid-1",
                "creationTimestamp": rfc3339(BEFORE),
                "generation": generation,
            },
            "spec": {"endpoint": "/v1/chat/completions", "inputFileID": FILE},
            "status": {"status": phase, "observedGeneration": 1, "conditions": conditions,
                       **status},
        }
    )  # fmt: skip


def ended(kind: str, reason: str, message: str) -> list[dict[str, Any]]:
    """The conditions of a batch that ended at ``NOW``: ``kind`` is Complete or Failed."""
    stamp = rfc3339(NOW)
    conditions = [
        {"type": "Reconciling", "status": "False", "reason": reason, "message": message,
         "lastTransitionTime": stamp},
        {"type": kind, "status": "True", "reason": reason, "message": message,
         "lastTransitionTime": stamp},
    ]  # fmt: skip
    if kind == "Failed":
        conditions.append({**conditions[1], "type": "Stalled"})
    return conditions


@pytest.mark.parametrize(
    ("before", "phase", "reason", "kind", "stamp"),
    [
        ("finalizing", Phase.COMPLETED, BatchEndReason.COMPLETED, "Complete", "completedAt"),
        ("finalizing", Phase.EXPIRED, BatchEndReason.EXPIRED, "Failed", "expiredAt"),
        ("cancelling", Phase.CANCELLED, BatchEndReason.CANCELLED, "Failed", "cancelledAt"),
        ("validating", Phase.CANCELLED, BatchEndReason.CANCELLED, "Failed", "cancelledAt"),
        ("finalizing", Phase.FAILED, BatchEndReason.POOL_DELETED, "Failed", "failedAt"),
    ],
)
def test_each_terminal_phase_patches_exactly_its_conditions(
    before: str, phase: Phase, reason: BatchEndReason, kind: str, stamp: str
) -> None:
    step = Step()
    transition(step, view(before), phase, NOW, reason, "2 completed, 1 failed of 3")
    assert step.to_patch() == {
        "status": phase.value,
        stamp: NOW,
        "conditions": ended(kind, reason.value, "2 completed, 1 failed of 3"),
    }


def test_a_validation_failure_patches_failed_and_stalled() -> None:
    step = Step()
    fail(step, view("validating"), [error("model_not_found", "no pool serves 'm'")], NOW, 2)
    message = "1 validation error(s); first: no pool serves 'm'"
    assert step.to_patch() == {
        "status": "failed",
        "failedAt": NOW,
        "errors": [{"code": "model_not_found", "message": "no pool serves 'm'"}],
        "requestCounts": {"total": 2, "completed": 0, "failed": 2},
        "conditions": ended("Failed", "ValidationFailed", message),
    }


def test_an_active_phase_is_reconciling_and_a_cancel_edit_is_observed() -> None:
    """A cancel bumps metadata.generation; the step that acts on it records it, or kstatus
    would report the batch in progress for ever."""
    step = Step()
    transition(
        step, view("in_progress", generation=2), Phase.CANCELLING, NOW, "CancelRequested", "c"
    )
    patch = step.to_patch()
    assert patch["observedGeneration"] == 2
    assert patch["conditions"] == [
        {"type": "Reconciling", "status": "True", "reason": "CancelRequested", "message": "c",
         "lastTransitionTime": rfc3339(BEFORE)},  # still True: its time does not move
    ]  # fmt: skip


def test_the_table_of_phase_conditions() -> None:
    def summary(phase: str) -> set[tuple[str, str]]:
        return {(c["type"], c["status"]) for c in phase_conditions(None, phase, "R", "m", NOW)}

    for phase in ("validating", "in_progress", "finalizing", "cancelling"):
        assert summary(phase) == {("Reconciling", "True")}
    assert summary("completed") == {("Reconciling", "False"), ("Complete", "True")}
    for phase in ("failed", "expired", "cancelled"):
        assert summary(phase) == {
            ("Reconciling", "False"),
            ("Failed", "True"),
            ("Stalled", "True"),
        }
    marker = [{"type": "Expired", "status": "True", "reason": "WindowPassed", "message": ""}]
    kept = phase_conditions(marker, "expired", "Expired", "m", NOW)
    assert kept[0] == marker[0]


# --- the whole reconciler: each way a batch ends ------------------------------------------------


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool())
    return harness


def _submit(h: ReconcilerHarness, requests: int = 3, **spec: object) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, FILE, requests))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE, **spec))


def _conditions(h: ReconcilerHarness) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in h.status(BATCH)["conditions"]}


def test_a_completed_batch_is_complete(h: ReconcilerHarness) -> None:
    _submit(h)
    h.step(BATCH)
    assert _conditions(h) == {"Reconciling": ("True", "Validated")}
    h.pool_round()
    h.run_jobs()
    h.step_until(BATCH, "completed")
    assert _conditions(h) == {
        "Reconciling": ("False", "Completed"),
        "Complete": ("True", "Completed"),
    }


def test_a_cancelled_batch_failed(h: ReconcilerHarness) -> None:
    _submit(h)
    h.step_until(BATCH, "in_progress")
    h.batch(BATCH)["spec"]["cancel"] = True
    h.step_until(BATCH, "cancelled")
    assert _conditions(h) == {
        "Reconciling": ("False", "Cancelled"),
        "Failed": ("True", "Cancelled"),
        "Stalled": ("True", "Cancelled"),
    }


def test_an_expired_batch_failed(h: ReconcilerHarness) -> None:
    _submit(h)
    h.step_until(BATCH, "in_progress")
    h.now = h.status(BATCH)["expiresAt"] + 1
    h.step_until(BATCH, "expired")
    assert _conditions(h) == {
        "Reconciling": ("False", "Expired"),
        "Expired": ("True", "WindowPassed"),
        "Failed": ("True", "Expired"),
        "Stalled": ("True", "Expired"),
    }


def test_a_batch_whose_pool_was_deleted_failed(h: ReconcilerHarness) -> None:
    _submit(h)
    h.step_until(BATCH, "in_progress")
    h.kube.remove("batchpools", None, "pool-a")
    h.step_until(BATCH, "failed")
    assert _conditions(h) == {
        "Reconciling": ("False", "PoolDeleted"),
        "PoolDeleted": ("True", "PoolDeleted"),
        "Failed": ("True", "PoolDeleted"),
        "Stalled": ("True", "PoolDeleted"),
    }


def test_a_batch_refused_at_validation_failed(tmp_path: pathlib.Path) -> None:
    h = ReconcilerHarness(tmp_path)  # no pool serves the model
    _submit(h)
    h.step_until(BATCH, "failed")
    assert _conditions(h) == {
        "Reconciling": ("False", "ValidationFailed"),
        "Failed": ("True", "ValidationFailed"),
        "Stalled": ("True", "ValidationFailed"),
    }
