"""What a Batch applied with kubectl may not be, refused at validation with the input's own
codes rather than retried: inline requests nested deeper than a line may be (the JSONL writer
cannot encode them, and the reconcile failed and was retried forever), and a completion window
longer than the longest a batch may have (for a Batch the API server stored before its CRD
refused one)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from llmbatch.api.resources import MAX_COMPLETION_WINDOW, InlineRequest
from llmbatch.core.inline import InvalidInlineRequest, inline_file
from llmbatch.core.tiers import window_refusal
from llmbatch.core.validation import ValidationLimits
from tests.fixtures.builders import make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

NAME = "batch-" + "d" * 24
FILE = "file-" + "d" * 32


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def request(custom_id: str, **body: Any) -> dict[str, Any]:
    return {
        "customID": custom_id,
        "url": "/v1/chat/completions",
        "body": {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            **body,
        },
    }


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool())
    return harness


def test_a_kubectl_batch_nested_300_levels_deep_fails_validation(h: ReconcilerHarness) -> None:
    requests = [request("fine"), request("deep", extra=nested(300))]
    h.kube.add("batches", make_batch(NAME, input_file_id=None, requests=requests))
    status = h.step_until(NAME, "failed", "in_progress", limit=3)
    assert status["status"] == "failed"
    (problem,) = status["errors"]
    assert problem["code"] == "nesting_too_deep"
    assert problem["line"] == 2
    assert status["requestCounts"] == {"total": 2, "completed": 0, "failed": 2}


def test_inline_requests_are_refused_as_deep_lines_before_they_are_encoded() -> None:
    limit = ValidationLimits().max_json_depth
    at_limit = InlineRequest.model_validate(request("r", extra=nested(limit - 3)))
    assert inline_file([at_limit]).requests == 1  # the line object, body, extra: 64 levels
    too_deep = InlineRequest.model_validate(request("r", extra=nested(limit - 2)))
    with pytest.raises(InvalidInlineRequest) as refused:
        inline_file([at_limit, too_deep])
    assert (refused.value.problem.code, refused.value.problem.line) == ("nesting_too_deep", 2)


@pytest.mark.parametrize("window", ["999999h", "73h", "4321m", "259201s"])
def test_a_window_longer_than_the_longest_fails_validation(
    h: ReconcilerHarness, window: str
) -> None:
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 2))
    h.kube.add("batches", make_batch(NAME, input_file_id=FILE, completionWindow=window))
    status = h.step_until(NAME, "failed", "in_progress", limit=3)
    assert status["status"] == "failed"
    (problem,) = status["errors"]
    assert (problem["code"], problem["param"]) == ("invalid_completion_window", "completionWindow")
    assert MAX_COMPLETION_WINDOW in problem["message"]


@pytest.mark.parametrize("window", ["72h", "4320m", "259200s", "24h", "90s"])
def test_windows_up_to_the_longest_are_accepted(window: str) -> None:
    assert window_refusal(window) is None
