"""The /v1/responses body rules: input, max_output_tokens, no stream, no stateful features."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from llmbatch.api.openai import ENDPOINTS, GENERATE_ENDPOINTS, POOLING_ENDPOINTS, Endpoint
from llmbatch.api.resources import BatchSpec
from llmbatch.api.shard import ShardSpec
from llmbatch.core.validation import (
    GENERATIVE_ENDPOINTS,
    OUTPUT_TOKEN_FIELDS_OF,
    SUPPORTED_ENDPOINTS,
    ValidationLimits,
    ValidationResult,
    check_request,
    normalize_endpoint,
    validate_stream,
)

RESPONSES = "/v1/responses"


def row(custom_id: str = "r1", **body: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"model": "m", "input": "Say hi.", "max_output_tokens": 32, **body}
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": RESPONSES,
        "body": {k: v for k, v in fields.items() if v is not ...},
    }


def run(*rows: dict[str, Any], **limits: Any) -> ValidationResult:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    return validate_stream([data], endpoint=RESPONSES, limits=ValidationLimits(**limits))


def problems(result: ValidationResult) -> list[tuple[str, int | None, str | None]]:
    return [(str(e.code), e.line, e.param) for e in result.errors]


def test_one_endpoint_list_everywhere() -> None:
    assert get_args(Endpoint) == ENDPOINTS
    assert RESPONSES in ENDPOINTS
    assert SUPPORTED_ENDPOINTS == ENDPOINTS
    assert set(GENERATE_ENDPOINTS) | set(POOLING_ENDPOINTS) == set(ENDPOINTS)
    assert set(OUTPUT_TOKEN_FIELDS_OF) == GENERATIVE_ENDPOINTS == set(GENERATE_ENDPOINTS)
    # The Batch custom resource and the shard spec take it (their schemas come from the type).
    BatchSpec.model_validate({"endpoint": RESPONSES, "inputFileID": "file-x"})
    schema = ShardSpec.model_json_schema()["properties"]["endpoint"]
    assert schema["enum"] == list(ENDPOINTS)


def test_openai_prefixed_responses_url() -> None:
    assert normalize_endpoint("/openai/v1/responses") == RESPONSES
    assert run(row("a"), {**row("b"), "url": "/openai/v1/responses"}).ok


@pytest.mark.parametrize(
    "value",
    [
        "Write a haiku.",
        [{"role": "user", "content": "hi"}],
        [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
    ],
)
def test_valid_inputs_declare_their_output_limit(value: Any) -> None:
    result = run(row("a", input=value, max_output_tokens=20), row("b"))
    assert result.ok, result.errors
    assert result.model == "m"
    assert result.declared_output_tokens == 52
    assert result.requests_without_output_limit == 0


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (..., "missing_input"),
        (None, "missing_input"),
        ("", "invalid_input"),
        ([], "invalid_input"),
        (42, "invalid_input"),
        ({"text": "hi"}, "invalid_input"),
        ([1, 2], "invalid_input"),
    ],
)
def test_input_is_required(value: Any, code: str) -> None:
    assert problems(run(row("a"), row("b", input=value))) == [(code, 2, "body.input")]


def test_max_output_tokens_is_the_limit() -> None:
    # max_tokens / max_completion_tokens do not bound a responses request.
    loose = run(row("a", max_output_tokens=...), row("b", max_output_tokens=..., max_tokens=9))
    assert loose.ok
    assert (loose.declared_output_tokens, loose.requests_without_output_limit) == (0, 2)
    strict = run(row("a"), row("b", max_output_tokens=...), require_output_token_limit=True)
    assert problems(strict) == [("missing_output_token_limit", 2, "body.max_output_tokens")]
    assert "max_output_tokens" in strict.errors[0].message
    bad = run(row("a", max_output_tokens=0), row("b", max_output_tokens="9"))
    assert problems(bad) == [
        ("invalid_output_token_limit", 1, "body.max_output_tokens"),
        ("invalid_output_token_limit", 2, "body.max_output_tokens"),
    ]


def test_stream_and_model_rules_apply() -> None:
    result = run(row("a", stream=True), row("b", model=...), row("c", stream=False))
    assert problems(result) == [
        ("stream_not_supported", 1, "body.stream"),
        ("missing_model", 2, "body.model"),
    ]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("previous_response_id", "resp_123"),
        ("conversation", "conv_123"),
        ("conversation", {"id": "conv_123"}),
        ("prompt", {"id": "pmpt_123", "version": "2"}),
        ("background", True),
    ],
)
def test_stateful_features_are_refused_naming_the_line(field: str, value: Any) -> None:
    result = run(row("a"), row("b"), row("c", **{field: value}))
    assert problems(result) == [("unsupported_parameter", 3, f"body.{field}")]
    assert "not supported in a batch" in result.errors[0].message


@pytest.mark.parametrize(
    "fields",
    [
        {"store": True},
        {"store": False},
        {"background": False},
        {"previous_response_id": None, "conversation": None, "prompt": None},
        {"instructions": "Be brief.", "temperature": 0, "text": {"format": {"type": "text"}}},
    ],
)
def test_harmless_fields_are_accepted(fields: dict[str, Any]) -> None:
    assert run(row("a", **fields)).ok


def test_check_request_reports_every_problem_of_a_line() -> None:
    line = row("a", input=..., previous_response_id="resp_1", background=True, stream=True)
    found, model, limit = check_request(line, endpoint=RESPONSES, limits=ValidationLimits(), line=7)
    assert (model, limit) == ("m", 32)
    assert {(str(p.code), p.param) for p in found} == {
        ("stream_not_supported", "body.stream"),
        ("missing_input", "body.input"),
        ("unsupported_parameter", "body.previous_response_id"),
        ("unsupported_parameter", "body.background"),
    }
    assert {p.line for p in found} == {7}


def test_responses_lines_do_not_fit_other_endpoints() -> None:
    data = json.dumps(row("a")).encode() + b"\n"
    chat = validate_stream([data], endpoint="/v1/chat/completions")
    assert [str(e.code) for e in chat.errors] == ["mismatched_url"]
