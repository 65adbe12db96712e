"""Which engine answers are retried, and when (pure: an answer and an attempt in, a decision out).

Seed 002: "Failed requests are retried. You are billed once per completed request." A request
the engine answered with a transient error — it was overloaded, timed out, or failed on its
own side — is sent again after an exponential backoff with jitter, up to the pool's
``retries.maxAttempts``; the caller's own mistakes are final at once, since sending the same
body again gets the same answer:

- **retried**: every 5xx (500 the engine failed, 502/503 overloaded or unavailable, 504 timed
  out), 408 (the engine timed the request out) and 429 (the engine is over capacity: the
  caller's own quotas are enforced by the gateway before a batch is accepted, so a 429 from the
  engine is load, not the caller);
- **final**: every other 4xx (400 bad body, 404 unknown model, 409 a conflict about the
  request itself, 413 too large, 422 unprocessable, ...) and the answers this platform gives
  itself (:data:`NEVER_RETRIED`: a request given up after crashing the engine).

A dead engine is no answer at all (``executor.runner``: the run ends ``ENGINE_FAILED``, its
requests run again elsewhere), so it never reaches this rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: 4xx answers that say "not now" rather than "not this request".
TRANSIENT_4XX = frozenset({408, 429})
#: Error codes of answers that are final whatever their status.
NEVER_RETRIED = frozenset({"request_crashed_engine", "invalid_request_line"})


@dataclass(frozen=True)
class RetryPolicy:
    """A pool's per-request retry settings (``BatchPool.spec.retries``)."""

    max_attempts: int = 1
    """Attempts of one request in all, the first included; 1: never retried."""
    backoff_seconds: float = 1.0
    """Wait before the first retry; it doubles with every further one..."""
    max_backoff_seconds: float = 30.0
    """...up to this."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {self.max_attempts}")
        if self.backoff_seconds < 0 or self.max_backoff_seconds < 0:
            raise ValueError("backoff seconds must not be negative")


def is_transient(status_code: int, error_code: str | None = None) -> bool:
    """Whether an engine answer may be different next time (see the module docstring)."""
    if error_code in NEVER_RETRIED:
        return False
    return status_code >= 500 or status_code in TRANSIENT_4XX


def backoff(policy: RetryPolicy, attempt: int, rand: Callable[[], float]) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based): "equal jitter" — half the
    exponential step fixed, half drawn from ``rand()`` in [0, 1), so retries of many requests
    that failed together (an overloaded engine) spread out instead of arriving together."""
    step = min(policy.max_backoff_seconds, policy.backoff_seconds * 2.0 ** (attempt - 1))
    return step / 2 + step / 2 * rand()


def retry_after(
    policy: RetryPolicy,
    attempt: int,
    status_code: int,
    error_code: str | None,
    rand: Callable[[], float],
) -> float | None:
    """Seconds until the next attempt of a request whose attempt ``attempt`` (1-based) got
    ``status_code``, or None when this answer is final (a success, a caller's error, or the
    last attempt allowed)."""
    if 200 <= status_code < 300 or not is_transient(status_code, error_code):
        return None
    if attempt >= policy.max_attempts:
        return None
    return backoff(policy, attempt, rand)


def attempts_note(attempts: int) -> str:
    """What the error message of a request that still failed with a transient error says about
    its attempts (appended to the engine's own message)."""
    plural = "attempt" if attempts == 1 else "attempts"
    return f" (failed after {attempts} {plural}; transient engine errors are retried with backoff)"


def error_code(body: dict[str, Any]) -> str | None:
    """The ``error.code`` of an error answer's body (the OpenAI envelope), if it has one."""
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def with_attempts(body: dict[str, Any], attempts: int) -> dict[str, Any]:
    """The body of a request that still failed, its message saying how many attempts it had:
    the OpenAI error envelope kept, only ``message`` grows (a copy; ``body`` is not changed)."""
    error = body.get("error")
    if not isinstance(error, dict):
        return body
    message = f"{error.get('message') or 'The engine failed.'}{attempts_note(attempts)}"
    return {**body, "error": {**error, "message": message}}
