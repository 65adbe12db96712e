"""What one reconcile step sees and decides: the Batch read once into typed models, and the typed
status patch plus the Events it returns. Phase changes go through :func:`transition` only."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from llmbatch.api.resources import (
    BatchConditionType,
    BatchSpec,
    BatchStatus,
    Condition,
    Phase,
    ValidationError,
)
from llmbatch.controller import metrics
from llmbatch.core import billing, lifecycle

log = logging.getLogger("llmbatch.controller.batches")

TERMINAL = frozenset({Phase.COMPLETED, Phase.FAILED, Phase.EXPIRED, Phase.CANCELLED})

#: The status field that records when a batch entered each phase (``validating`` has none: it
#: starts at ``createdAt``).
PHASE_STAMP: dict[Phase, str] = {
    Phase.IN_PROGRESS: "in_progress_at",
    Phase.FINALIZING: "finalizing_at",
    Phase.COMPLETED: "completed_at",
    Phase.FAILED: "failed_at",
    Phase.EXPIRED: "expired_at",
    Phase.CANCELLING: "cancelling_at",
    Phase.CANCELLED: "cancelled_at",
}


@dataclass(frozen=True)
class BatchView:
    """One Batch as the step read it: identity, spec and status, parsed once."""

    namespace: str
    name: str
    uid: str
    created: int
    """Unix seconds of ``metadata.creationTimestamp``."""
    generation: int | None
    spec: BatchSpec
    status: BatchStatus
    credit_reserved: bool = False
    """The gateway reserved its credit at creation (``core.billing.RESERVED_ANNOTATION``)."""

    @classmethod
    def parse(cls, body: dict[str, Any]) -> BatchView:
        meta = body["metadata"]
        stamp = meta.get("creationTimestamp")
        annotations = meta.get("annotations") or {}
        return cls(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            created=lifecycle.unix_seconds(stamp) if stamp else int(time.time()),
            generation=meta.get("generation"),
            spec=BatchSpec.model_validate(body.get("spec") or {}),
            status=BatchStatus.model_validate(body.get("status") or {}),
            credit_reserved=annotations.get(billing.RESERVED_ANNOTATION) == "true",
        )

    def after(self, step: Step) -> BatchView:
        """This batch as it will be once ``step``'s status patch has landed."""
        changed = {name: getattr(step.patch, name) for name in step.patch.model_fields_set}
        return replace(self, status=self.status.model_copy(update=changed))

    def has_condition(self, kind: BatchConditionType) -> bool:
        return any(c.type == kind and c.status == "True" for c in self.status.conditions or [])


@dataclass
class Step:
    """What one reconcile step decided: a status patch (only the fields set) and Events."""

    patch: BatchStatus = field(default_factory=BatchStatus)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) — type is Normal or Warning."""
    transitions: list[tuple[Phase, str, str]] = field(default_factory=list)
    """(phase, reason, message) of every phase change this step decided: logged and counted
    once its patch has landed (:func:`announce`), so a step refused on a changed object
    announces nothing."""
    requeue_at: float | None = None
    """When the batch wants its next step although nothing changes (its expiry, a throttled
    progress fold, slots still flushing): the work queue's ``RequeueAfter``."""

    def again(self, when: float) -> None:
        """Ask for a step at ``when`` (the earliest of what the phases ask for wins)."""
        self.requeue_at = when if self.requeue_at is None else min(self.requeue_at, when)

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))

    def posted_events(self) -> list[tuple[str, str, str]]:
        """The Events to post for this step: each Warning on its own, the Normal ones as one
        (the last one's reason, every message in order), so a batch accepted and validated in
        one step costs one Event write, not two."""
        warnings = [e for e in self.events if e[0] == "Warning"]
        normal = [e for e in self.events if e[0] != "Warning"]
        if len(normal) > 1:
            normal = [("Normal", normal[-1][1], "; ".join(message for _, _, message in normal))]
        return normal + warnings

    def set(self, **changes: Any) -> None:
        """Set status fields (snake_case names of :class:`BatchStatus`) in the patch."""
        for name, value in changes.items():
            setattr(self.patch, name, value)

    def has(self, name: str) -> bool:
        return name in self.patch.model_fields_set

    @property
    def phase(self) -> Phase | None:
        """The phase this step moves the batch to, if it moves it."""
        return self.patch.status if self.has("status") else None

    def to_patch(self) -> dict[str, Any]:
        """The camelCase merge patch of ``status`` (a field set to None is removed)."""
        out: dict[str, Any] = {}
        for name in sorted(self.patch.model_fields_set):
            value = getattr(self.patch, name)
            alias = BatchStatus.model_fields[name].alias or name
            out[alias] = _wire(value)
        return out


def _wire(value: Any) -> Any:
    if isinstance(value, list):
        return [_wire(item) for item in value]
    if hasattr(value, "to_k8s"):
        return value.to_k8s()
    return value


class Rejected(Exception):
    """Validation failed: the batch becomes ``failed`` with these errors (``total``: requests
    counted so far, all of them failed)."""

    def __init__(self, errors: list[ValidationError], total: int = 0) -> None:
        super().__init__(errors[0].message if errors else "rejected")
        self.errors = errors
        self.total = total


def error(code: str, message: str, param: str | None = None, line: int | None = None) -> Any:
    """One ``status.errors`` item (the message cut to what the CRD takes)."""
    return ValidationError(code=code, message=message[:4096], param=param, line=line)


def errors_of(items: list[dict[str, Any]]) -> list[ValidationError]:
    """Typed errors from the validator's ``InvalidLine.as_dict()`` items."""
    return [error(str(e["code"]), str(e["message"]), e.get("param"), e.get("line")) for e in items]


def _current_conditions(step: Step, batch: BatchView) -> list[dict[str, Any]]:
    """The batch's conditions with what this step already changed, as plain dicts."""
    current = step.patch.conditions if step.has("conditions") else batch.status.conditions
    return [c.to_k8s() for c in current or []]


def _set_conditions(step: Step, conditions: list[dict[str, Any]]) -> None:
    step.set(conditions=[Condition.model_validate(c) for c in conditions])


def set_condition(
    step: Step,
    batch: BatchView,
    kind: BatchConditionType,
    status: bool,
    reason: str,
    message: str,
    now: float,
) -> None:
    """Set a condition on top of what this step already changed (its transition time moves only
    when its status flips)."""
    plain = _current_conditions(step, batch)
    _set_conditions(step, lifecycle.set_condition(plain, kind, status, reason, message, now))


def enter_phase_conditions(
    step: Step, batch: BatchView, phase: Phase, reason: str, message: str, now: float
) -> None:
    """The conditions of a batch entering ``phase`` (``core.lifecycle.phase_conditions``)."""
    plain = _current_conditions(step, batch)
    _set_conditions(step, lifecycle.phase_conditions(plain, phase, reason, message, now))
    observe_generation(step, batch)


def observe_generation(step: Step, batch: BatchView) -> None:
    """Record the spec generation this step acted on, when it changed (a cancel): kstatus takes
    an object whose ``observedGeneration`` lags ``metadata.generation`` for one in progress."""
    if batch.generation is not None and batch.status.observed_generation != batch.generation:
        step.set(observed_generation=batch.generation)


def transition(
    step: Step, batch: BatchView, phase: Phase, now: float, reason: str, message: str
) -> None:
    """Move the batch to ``phase``: its timestamp, its conditions, an Event, a metric. Only the
    moves of ``core.lifecycle.PHASE_TRANSITIONS`` are allowed (terminal phases absorb)."""
    before = step.phase if step.has("status") else batch.status.status
    lifecycle.check_transition(None if before is None else str(before), phase.value)
    step.set(status=phase)
    if phase in PHASE_STAMP:
        step.set(**{PHASE_STAMP[phase]: int(now)})
    enter_phase_conditions(step, batch, phase, reason, message, now)
    step.event(reason, message, warning=phase in (Phase.FAILED, Phase.EXPIRED))
    step.transitions.append((phase, reason, message))


def announce(namespace: str, name: str, step: Step) -> None:
    """Log and count the phase changes of a step whose patch has landed."""
    for phase, reason, message in step.transitions:
        metrics.BATCH_TRANSITIONS.labels(phase.value).inc()
        log.info("batch %s/%s → %s (%s): %s", namespace, name, phase, reason, message)
