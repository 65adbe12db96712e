"""What the client commands compute from the API's answers, without I/O: exit codes, progress
and the failures of an error file grouped by code."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class ExitCode(enum.IntEnum):
    """How ``llmbatch batches`` ends, for scripts (docs/cli.md lists them)."""

    COMPLETED = 0
    """The batch completed (or the command did what it was asked)."""
    ERROR = 1
    """The command could not do its work: the gateway refused it or could not be reached."""
    USAGE = 2
    """Bad arguments (click's own code)."""
    FAILED = 3
    """The batch failed (its input was refused, or its pool was deleted)."""
    EXPIRED = 4
    """The batch expired before every request ran."""
    CANCELLED = 5
    """The batch was cancelled."""
    INTERRUPTED = 130
    """Ctrl-C while waiting: the batch keeps running."""


_BY_STATUS = {
    "completed": ExitCode.COMPLETED,
    "failed": ExitCode.FAILED,
    "expired": ExitCode.EXPIRED,
    "cancelled": ExitCode.CANCELLED,
}


def exit_code(status: str) -> ExitCode:
    """The exit code of a command that ends on a batch in ``status`` (a terminal one)."""
    return _BY_STATUS.get(status, ExitCode.ERROR)


@dataclass(frozen=True)
class Progress:
    """Where a batch is, as a progress bar shows it."""

    batch_id: str
    status: str
    done: int
    """Requests with a result: completed + failed."""
    failed: int
    total: int | None
    """None while the total is not known yet (validating)."""
    created_at: int
    estimated_completion_at: int | None
    """Unix seconds, when the server gives an estimate (``estimated_completion_at``)."""

    @classmethod
    def of(cls, batch: Any) -> Progress:
        """The progress of an SDK ``Batch`` object."""
        counts = batch.request_counts
        total = counts.total if counts is not None and counts.total else None
        completed = counts.completed if counts is not None else 0
        failed = counts.failed if counts is not None else 0
        return cls(
            batch_id=batch.id,
            status=batch.status,
            done=completed + failed,
            failed=failed,
            total=total,
            created_at=batch.created_at,
            estimated_completion_at=estimate(batch.model_extra or {}),
        )

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def describe(self, now: float) -> str:
        """One line: status, done/total, failed, elapsed and the estimate when there is one."""
        parts = [f"{self.batch_id} {self.status}", self.counts()]
        parts.append(f"{duration(now - self.created_at)} elapsed")
        eta = self.eta(now)
        if eta:
            parts.append(eta)
        return ", ".join(parts)

    def counts(self) -> str:
        """``12/40 done, 1 failed`` (``?/?`` while the total is not known)."""
        done = f"{self.done}/{self.total}" if self.total is not None else "?/?"
        return f"{done} done, {self.failed} failed"

    def eta(self, now: float) -> str:
        """``done in 3m05s`` while the server estimates the completion, else empty."""
        if self.finished or self.estimated_completion_at is None:
            return ""
        return f"done in ~{duration(max(0.0, self.estimated_completion_at - now))}"


def estimate(extra: Mapping[str, Any]) -> int | None:
    """The server's estimate of completion (unix seconds) from a batch's extra fields, if any."""
    value = extra.get("estimated_completion_at")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return None
    return int(value)


def duration(seconds: float) -> str:
    """``1h02m03s``, ``3m05s`` or ``12s``."""
    whole = int(max(0.0, seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass
class FailureGroup:
    """The failed requests of one error code, with the first as an example."""

    code: str
    count: int
    example_custom_id: str
    example_message: str


def failure_of(line: Mapping[str, Any]) -> tuple[str, str]:
    """(code, message) of an error-file line: a request that never ran carries ``error``; one
    the model answered with an error carries ``response.status_code`` ≥ 400 and its body."""
    error = line.get("error")
    if isinstance(error, Mapping):
        return str(error.get("code") or "error"), str(error.get("message") or "")
    response = _mapping(line.get("response"))
    detail = _mapping(_mapping(response.get("body")).get("error"))
    code = detail.get("code") or detail.get("type") or f"http_{response.get('status_code', '?')}"
    return str(code), str(detail.get("message") or "")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def summarize_failures(lines: Iterable[bytes]) -> list[FailureGroup]:
    """The error file's lines grouped by code, the most frequent first."""
    groups: dict[str, FailureGroup] = {}
    for raw in lines:
        if not raw.strip():
            continue
        line = orjson.loads(raw)
        code, message = failure_of(line)
        group = groups.get(code)
        if group is None:
            groups[code] = FailureGroup(code, 1, str(line.get("custom_id", "")), message)
        else:
            group.count += 1
    return sorted(groups.values(), key=lambda g: (-g.count, g.code))
