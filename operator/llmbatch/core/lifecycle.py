"""Pure pieces of the Batch lifecycle: windows, conditions, never-run lines, cost."""

from __future__ import annotations

import datetime as dt
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import orjson

from llmbatch.api.resources import BatchConditionType
from llmbatch.core.ids import batch_request_id

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
ACTIVE = frozenset({"validating", "in_progress", "finalizing", "cancelling"})

#: The Batch lifecycle, the one table of it: phase before (None: a batch with no status yet) →
#: the phases it may move to. Terminal phases absorb: nothing leaves them, so a finished batch
#: is never merged, published, settled or announced again, whatever view of it a step holds.
PHASE_TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"validating"}),
    "validating": frozenset({"in_progress", "failed", "cancelled", "expired"}),
    "in_progress": frozenset({"finalizing", "cancelling"}),
    "finalizing": frozenset({"completed", "expired", "failed"}),
    "cancelling": frozenset({"cancelled"}),
    **{phase: frozenset() for phase in TERMINAL},
}


class IllegalTransition(RuntimeError):
    """A step tried a phase change the lifecycle does not have (a bug, or a stale view)."""


def check_transition(before: str | None, after: str) -> None:
    """Raise :class:`IllegalTransition` unless ``before`` → ``after`` is in the table."""
    if after not in PHASE_TRANSITIONS.get(before, frozenset()):
        raise IllegalTransition(f"a batch cannot go from {before or 'new'} to {after}")


NEVER_RUN_MESSAGES: dict[str, str] = {
    "batch_expired": "This request could not be executed before the completion window expired.",
    "batch_cancelled": "This request was not executed because the batch was cancelled.",
    "shard_failed": "This request was not executed because its shard failed: {reason}",
    "pool_deleted": "This request was not executed because {reason}.",
}

_UNITS = {"s": 1, "m": 60, "h": 3600}


def window_seconds(window: str) -> int:
    """Seconds of a completion window such as ``24h``, ``30m`` or ``90s``."""
    if len(window) < 2 or window[-1] not in _UNITS or not window[:-1].isdigit():
        raise ValueError(f"bad completion window: {window!r}")
    return int(window[:-1]) * _UNITS[window[-1]]


def rfc3339(now: float) -> str:
    """Kubernetes timestamp of unix seconds."""
    return dt.datetime.fromtimestamp(int(now), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unix_seconds(stamp: str) -> int:
    """Unix seconds of a Kubernetes timestamp (``...Z`` or ``...+00:00``)."""
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


def set_condition(
    conditions: list[dict[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with one condition set; its time moves only when status flips."""
    result = [dict(c) for c in conditions or []]
    value = "True" if status else "False"
    for cond in result:
        if cond.get("type") == type_:
            if cond.get("status") != value:
                cond["lastTransitionTime"] = rfc3339(now)
            cond.update(status=value, reason=reason, message=message[:32768])
            return result
    result.append(
        {
            "type": str(type_),
            "status": value,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": rfc3339(now),
        }
    )
    return result


#: Condition types older releases set on a Batch and a step removes (``Ready`` was True on every
#: terminal phase, failed ones too, which misled ``kubectl wait`` and kstatus).
RETIRED_CONDITIONS = frozenset({"Ready"})


def phase_conditions(
    conditions: list[dict[str, Any]] | None,
    phase: str,
    reason: str,
    message: str,
    now: float,
) -> list[dict[str, Any]]:
    """A copy of a batch's ``conditions`` as they are once it enters ``phase``.

    Active phases: ``Reconciling=True``. Completed: ``Reconciling=False``, ``Complete=True``.
    Failed, expired, cancelled: ``Reconciling=False``, ``Failed=True``, ``Stalled=True``. The
    reason and message are the transition's; other conditions are kept, retired ones dropped."""
    kept = [c for c in conditions or [] if c.get("type") not in RETIRED_CONDITIONS]
    ended = phase in TERMINAL
    result = set_condition(kept, BatchConditionType.RECONCILING, not ended, reason, message, now)
    if phase == "completed":
        return set_condition(result, BatchConditionType.COMPLETE, True, reason, message, now)
    if ended:
        result = set_condition(result, BatchConditionType.FAILED, True, reason, message, now)
        result = set_condition(result, BatchConditionType.STALLED, True, reason, message, now)
    return result


def never_run_line(batch_uid: str, custom_id: str, code: str, reason: str = "") -> bytes:
    """An error-file line for a request that never ran (expired, cancelled, failed shard)."""
    message = NEVER_RUN_MESSAGES[code].format(reason=reason or "unknown")
    return orjson.dumps(
        {
            "id": batch_request_id(batch_uid, custom_id),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


def cost_of(
    input_tokens: int, output_tokens: int, input_per_million: str, output_per_million: str
) -> str:
    """Cost at per-1M-token prices, as a decimal string rounded to 1e-6 (no float on the way)."""
    total = (
        Decimal(input_tokens) * Decimal(input_per_million)
        + Decimal(output_tokens) * Decimal(output_per_million)
    ) / Decimal(1_000_000)
    return str(total.quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP))
