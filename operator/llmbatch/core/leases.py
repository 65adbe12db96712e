"""A shard lease's lifecycle as one table (pure): which event moves which state where.

A lease (``api.slot.ShardLease``) is the placement record and the fencing token of one shard:
the runner holding it writes only while the lease is ``granted``, to its slot, at its
generation (``storage.slotchannel.LeaseFence``). So every event that takes the shard from a
slot — a grant elsewhere, a release back to the queue, done, failed, fenced by finalisation —
raises the generation and clears the slot (kept as ``ran_on``, a record, never a fence): a
runner that was paused or given up for lost can never pass the check again, and a repeated
settlement (a lost answer retried) finds the lease already moved on instead of counting a
second attempt.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from llmbatch.api.slot import LeaseState, ShardLease


class LeaseEvent(enum.Enum):
    GRANT = "grant"
    """Give the shard to a slot (from the queue, or re-granted elsewhere)."""
    RELEASE = "release"
    """Back to the queue: taken back, its run failed with attempts left, or its slot was lost."""
    DONE = "done"
    """Every request of the shard has a result."""
    FAIL = "fail"
    """Given up: the shard's remaining requests become ``shard_failed`` lines."""
    FENCE = "fence"
    """Its batch is finishing: no slot runs it again."""
    WITHDRAW = "withdraw"
    """Given up while it waits: its pool no longer serves its model (removed after the batch
    was accepted). Its requests become ``shard_failed`` lines; a run under way ends first."""


#: (state before or None for no lease yet, event) -> state after. Anything else is refused.
TRANSITIONS: dict[tuple[LeaseState | None, LeaseEvent], LeaseState] = {
    (None, LeaseEvent.GRANT): "granted",
    ("released", LeaseEvent.GRANT): "granted",
    ("granted", LeaseEvent.GRANT): "granted",  # the operator gave up its slot for lost
    ("granted", LeaseEvent.RELEASE): "released",
    ("granted", LeaseEvent.DONE): "done",
    ("granted", LeaseEvent.FAIL): "failed",
    (None, LeaseEvent.FENCE): "fenced",
    ("released", LeaseEvent.FENCE): "fenced",
    ("granted", LeaseEvent.FENCE): "fenced",
    (None, LeaseEvent.WITHDRAW): "failed",
    ("released", LeaseEvent.WITHDRAW): "failed",
}

#: Lease states in which a shard may still be (re)granted: held by a slot, or back in the queue.
OPEN_STATES: frozenset[LeaseState] = frozenset(
    state for (state, event) in TRANSITIONS if event is LeaseEvent.GRANT and state is not None
)


#: Lease states no event leaves (done, failed, fenced): a shard seen in one never waits again.
ENDED_STATES: frozenset[LeaseState] = frozenset(
    after for after in TRANSITIONS.values() if not any(s == after for s, _ in TRANSITIONS)
)


def allowed(lease: ShardLease | None, event: LeaseEvent) -> bool:
    """Whether ``event`` may happen to ``lease`` (None: the shard has no lease yet)."""
    return (None if lease is None else lease.state, event) in TRANSITIONS


def transition(
    lease: ShardLease | None,
    event: LeaseEvent,
    *,
    slot: str = "",
    now: float = 0.0,
    reason: str | None = None,
    message: str | None = None,
    attempts: int | None = None,
) -> ShardLease | None:
    """The lease after ``event``, or None when the event is refused in its state.

    Every event raises the generation; only a grant names a slot (and its time). ``reason``,
    ``message`` and ``attempts`` record how the last run ended (a release or failure).
    """
    if not allowed(lease, event):
        return None
    base = lease or ShardLease(generation=0, state="released")
    update: dict[str, object] = {
        "generation": base.generation + 1,
        "state": TRANSITIONS[(None if lease is None else lease.state, event)],
        "slot": slot if event is LeaseEvent.GRANT else "",
        "ran_on": slot if event is LeaseEvent.GRANT else (base.slot or base.ran_on),
    }
    if event is LeaseEvent.GRANT:
        update["granted_at"] = now
    else:
        update["reason"] = reason
        update["message"] = message
        if attempts is not None:
            update["attempts"] = attempts
    return base.model_copy(update=update)


#: The Event reason of a run that ended early, by how it ended.
END_REASONS: dict[str, str] = {
    "engine_failed": "EngineFailed",
    "store_failed": "StoreFailed",
    "lost": "SlotLost",
    "slot_failed": "SlotFailed",
    "incomplete": "ShardIncomplete",
}
#: A shard under which this many different slots failed (or were lost) is given up: it is
#: presumed the cause (a request that kills the executor), whatever attempts remain.
SLOT_FAILURES_TO_GIVE_UP = 2
_SLOT_FAILURES = ("lost", "slot_failed")
_REMEMBERED_SLOTS = 4


@dataclass(frozen=True)
class RunEnd:
    """How one run of a shard ended, as the pool round observed it."""

    state: str
    """done, preempted, lease_lost, or a failure: engine_failed, store_failed, incomplete
    (done without a result for every request), lost (its slot's heartbeat lapsed),
    slot_failed (its slot Job failed)."""
    slot: str
    message: str | None = None
    counts_attempt: bool = True
    """False when the run's end is not the shard's doing: an engine crash the slot attributed
    to the requests in flight (they are isolated on the next run), or one during which this
    shard had nothing in the engine."""
    crash_suspects: int = 0
    """Requests of this run the engine crash was laid at (0: it had none inside)."""


def crash_budget(backoff_limit: int) -> int:
    """Engine crashes with a shard's requests inside that it outlives without an attempt: each
    one isolates its suspects, so a poison request is found within two; a shard under which the
    engine keeps crashing beyond this is given up (the engine, not a request, is broken)."""
    return 2 * (backoff_limit + 1)


def settle(lease: ShardLease, end: RunEnd, backoff_limit: int) -> ShardLease | None:
    """The lease after a run ended, or None when there is nothing to record (the run had lost
    its lease already, or the lease is no longer granted).

    Done and preempted runs cost nothing. A failure counts one attempt and sends the shard back
    to the queue; the shard is given up after ``backoff_limit`` re-runs, or once
    :data:`SLOT_FAILURES_TO_GIVE_UP` different slots failed under it — one failed slot is a
    verdict on the slot, not on the shard. An engine crash the slot laid at requests costs no
    attempt; it counts toward :func:`crash_budget` only when the shard had requests inside.
    """
    if end.state == "lease_lost":
        return None
    if end.state == "done":
        return transition(lease, LeaseEvent.DONE)
    if end.state == "preempted":
        return transition(lease, LeaseEvent.RELEASE)
    reason = END_REASONS.get(end.state, "ShardFailed")
    message = (end.message or reason)[:1024]
    if not end.counts_attempt:
        crashes = lease.crashes + (1 if end.crash_suspects else 0)
        over = crashes > crash_budget(backoff_limit)
        if over:
            message = f"{message}; gave up after the engine crashed {crashes} times under it"
        moved = transition(
            lease,
            LeaseEvent.FAIL if over else LeaseEvent.RELEASE,
            reason=reason,
            message=message[:1024],
        )
        return None if moved is None else moved.model_copy(update={"crashes": crashes})
    attempts = lease.attempts + 1
    failed_slots = list(lease.failed_slots)
    if end.state in _SLOT_FAILURES and end.slot not in failed_slots:
        failed_slots = [*failed_slots, end.slot][-_REMEMBERED_SLOTS:]
    give_up = attempts > backoff_limit or len(failed_slots) >= SLOT_FAILURES_TO_GIVE_UP
    if give_up:
        why = (
            f"{len(failed_slots)} slots failed under it"
            if attempts <= backoff_limit
            else f"{attempts} attempts"
        )
        message = f"{message}; gave up after {why}"[:1024]
    moved = transition(
        lease,
        LeaseEvent.FAIL if give_up else LeaseEvent.RELEASE,
        reason=reason,
        message=message,
        attempts=attempts,
    )
    return None if moved is None else moved.model_copy(update={"failed_slots": failed_slots})
