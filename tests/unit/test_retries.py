"""Which engine answers are retried, and when (``core.retries``, pure)."""

from __future__ import annotations

import pytest

from llmbatch.core.retries import (
    RetryPolicy,
    attempts_note,
    backoff,
    error_code,
    is_transient,
    retry_after,
    with_attempts,
)

POLICY = RetryPolicy(max_attempts=3, backoff_seconds=1.0, max_backoff_seconds=30.0)


@pytest.mark.parametrize("status", [500, 502, 503, 504, 408, 429])
def test_engine_side_failures_are_transient(status: int) -> None:
    assert is_transient(status)
    assert retry_after(POLICY, 1, status, None, lambda: 0.5) is not None


@pytest.mark.parametrize("status", [200, 400, 401, 403, 404, 409, 413, 422])
def test_successes_and_the_callers_own_errors_are_final(status: int) -> None:
    assert retry_after(POLICY, 1, status, None, lambda: 0.5) is None


def test_a_request_given_up_for_crashing_the_engine_is_never_retried() -> None:
    assert not is_transient(500, "request_crashed_engine")
    assert retry_after(POLICY, 1, 500, "request_crashed_engine", lambda: 0.0) is None


def test_attempts_are_bounded_by_the_policy() -> None:
    delays = [retry_after(POLICY, attempt, 503, None, lambda: 0.0) for attempt in (1, 2, 3, 4)]
    assert delays == [0.5, 1.0, None, None]
    assert retry_after(RetryPolicy(max_attempts=1), 1, 503, None, lambda: 0.0) is None


def test_backoff_doubles_with_half_of_it_jittered_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=20, backoff_seconds=1.0, max_backoff_seconds=8.0)
    assert [backoff(policy, n, lambda: 0.0) for n in (1, 2, 3, 4, 5, 9)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        4.0,
        4.0,
    ]
    assert [backoff(policy, n, lambda: 0.999999) for n in (1, 2, 4, 9)] == pytest.approx(
        [1.0, 2.0, 8.0, 8.0], abs=1e-5
    )


def test_a_policy_without_an_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="negative"):
        RetryPolicy(backoff_seconds=-1)


def test_the_note_names_the_attempts() -> None:
    assert "failed after 3 attempts" in attempts_note(3)
    assert "failed after 1 attempt;" in attempts_note(1)


def test_the_noted_body_keeps_the_envelope_and_leaves_the_original() -> None:
    error = {"message": "Overloaded.", "type": "server_error", "param": None, "code": None}
    body = {"error": error}
    noted = with_attempts(body, 3)
    assert noted["error"]["message"] == "Overloaded." + attempts_note(3)
    assert {k: v for k, v in noted["error"].items() if k != "message"} == {
        "type": "server_error",
        "param": None,
        "code": None,
    }
    assert body["error"]["message"] == "Overloaded."
    assert error_code({"error": {"code": "request_crashed_engine"}}) == "request_crashed_engine"
    assert error_code({"object": "chat.completion"}) is None
