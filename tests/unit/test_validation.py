"""Every validation rule and every bad-input class, with exact line numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmbatch.core.validation import (
    ErrorCode,
    LineValidator,
    UnsupportedEndpoint,
    ValidationLimits,
    ValidationResult,
    iter_lines,
    normalize_endpoint,
    validate_stream,
)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def line(custom_id: str = "r1", **overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16,
        },
    }
    row.update(overrides)
    return row


def jsonl(*rows: Any) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def run(
    data: bytes, endpoint: str = CHAT, chunk: int | None = None, **limits: Any
) -> ValidationResult:
    pieces = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return validate_stream(pieces, endpoint=endpoint, limits=ValidationLimits(**limits))


def codes(result: ValidationResult) -> list[tuple[str, int | None]]:
    return [(str(e.code), e.line) for e in result.errors]


def test_valid_file_reports_count_model_and_bytes() -> None:
    data = jsonl(line("a"), line("b"), line("c"))
    result = run(data)
    assert result.ok
    assert result.request_count == 3
    assert result.model == "m"
    assert result.total_bytes == len(data)
    assert result.declared_output_tokens == 48


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, None])
def test_chunking_never_changes_the_verdict(chunk: int | None) -> None:
    data = jsonl(line("a"), b"not json", line("a"), line("c", url="/v1/embeddings"))
    assert codes(run(data, chunk=chunk)) == [
        ("invalid_json_line", 2),
        ("duplicate_custom_id", 3),
        ("mismatched_url", 4),
    ]


def test_invalid_json_and_non_object_lines() -> None:
    data = jsonl(line("a"), b"{broken", b"[1, 2]", b'"text"', line("b"))
    assert codes(run(data)) == [
        ("invalid_json_line", 2),
        ("invalid_json_line", 3),
        ("invalid_json_line", 4),
    ]
    assert "Line 2" in run(data).errors[0].message


def test_custom_id_rules() -> None:
    long_id = "x" * 513
    data = jsonl(
        {k: v for k, v in line().items() if k != "custom_id"},
        line(""),
        line(7),  # type: ignore[arg-type]
        line(long_id),
        line("dup"),
        line("dup"),
    )
    result = run(data)
    assert codes(result) == [
        ("missing_custom_id", 1),
        ("invalid_custom_id", 2),
        ("invalid_custom_id", 3),
        ("invalid_custom_id", 4),
        ("duplicate_custom_id", 6),
    ]
    assert all(e.param == "custom_id" for e in result.errors)


def test_method_url_and_body_rules() -> None:
    data = jsonl(
        line("a", method="GET"),
        {k: v for k, v in line("b").items() if k != "url"},
        line("c", url="/v1/completions"),
        line("d", body=[1]),
        line("e", body={"messages": []}),
        line("f", body={"model": "m", "stream": True, "max_tokens": 5}),
    )
    assert codes(run(data)) == [
        ("invalid_method", 1),
        ("missing_url", 2),
        ("mismatched_url", 3),
        ("invalid_body", 4),
        ("missing_model", 5),
        ("stream_not_supported", 6),
    ]


def test_openai_prefixed_urls_match_plain_endpoint() -> None:
    data = jsonl(line("a", url="/openai/v1/chat/completions"), line("b"))
    assert run(data).ok
    assert run(data, endpoint="/openai/v1/chat/completions").ok
    assert normalize_endpoint("/openai/v1/embeddings") == "/v1/embeddings"
    assert normalize_endpoint("/v1/images/generations") is None


def test_unsupported_batch_endpoint_is_refused() -> None:
    with pytest.raises(UnsupportedEndpoint, match="Unsupported endpoint"):
        LineValidator("/v1/moderations")


def test_one_model_per_file() -> None:
    other = line("b")
    other["body"] = {**other["body"], "model": "other"}
    result = run(jsonl(line("a"), other, line("c")))
    assert codes(result) == [("mismatched_model", 2)]
    assert result.errors[0].param == "body.model"


def test_output_token_limit_rule_is_optional() -> None:
    bare = line("a")
    del bare["body"]["max_tokens"]
    completion_style = line("b")
    del completion_style["body"]["max_tokens"]
    completion_style["body"]["max_completion_tokens"] = 10
    data = jsonl(bare, completion_style)
    assert run(data).ok
    strict = run(data, require_output_token_limit=True)
    assert codes(strict) == [("missing_output_token_limit", 1)]


def test_output_token_limit_must_be_positive_integer() -> None:
    bad = line("a")
    bad["body"]["max_tokens"] = 0
    worse = line("b")
    worse["body"]["max_tokens"] = "ten"
    assert codes(run(jsonl(bad, worse))) == [
        ("invalid_output_token_limit", 1),
        ("invalid_output_token_limit", 2),
    ]


def test_embeddings_need_no_output_limit() -> None:
    row = {
        "custom_id": "e",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": "minilm", "input": "hello"},
    }
    assert run(jsonl(row), endpoint="/v1/embeddings", require_output_token_limit=True).ok


def test_line_byte_limit_reports_and_skips_only_that_line() -> None:
    big = line("big")
    big["body"]["messages"][0]["content"] = "x" * 5000
    data = jsonl(line("a"), big, line("c"))
    for chunk in (None, 100, 1000):
        result = run(data, chunk=chunk, max_line_bytes=1024)
        assert codes(result) == [("line_too_large", 2)], chunk
        assert result.request_count == 3
        assert sum(s.request_count for s in result.shards) == 3


def test_too_many_requests_stops_early() -> None:
    data = jsonl(*(line(f"r{i}") for i in range(10)))
    result = run(data, max_requests=4)
    assert codes(result) == [("too_many_requests", 5)]
    assert result.aborted


def test_file_size_limit_stops_reading() -> None:
    data = jsonl(*(line(f"r{i}") for i in range(50)))
    validator = LineValidator(CHAT, ValidationLimits(max_bytes=1000))
    fed = 0
    for offset in range(0, len(data), 256):
        fed += 1
        if not validator.feed(data[offset : offset + 256]):
            break
    result = validator.finish()
    assert codes(result) == [("file_too_large", None)]
    assert fed < len(data) // 256  # stopped without reading the rest


def test_encoding_bom_crlf_blank_lines_and_missing_final_newline() -> None:
    body = jsonl(line("a")).rstrip(b"\n")
    data = b"\xef\xbb\xbf" + body + b"\r\n\r\n   \n" + json.dumps(line("b")).encode()
    result = run(data, chunk=3)
    assert result.ok, result.errors
    assert result.request_count == 2
    assert result.line_count == 4
    bad = jsonl(line("a")) + b'{"custom_id": "\xff\xfe"}\n'
    assert codes(run(bad)) == [("invalid_encoding", 2)]


def test_empty_and_blank_files() -> None:
    assert codes(run(b"")) == [("empty_file", None)]
    assert codes(run(b"\n\n  \r\n")) == [("empty_file", None)]


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    deep = b'{"custom_id": "d", "body": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    medium = line("m")
    medium["body"]["x"] = json.loads("[" * 80 + "]" * 80)
    result = run(jsonl(line("a"), deep, medium))
    assert [c for c, _ in codes(result)] in (
        ["invalid_json_line", "nesting_too_deep"],  # orjson's own recursion limit on line 2
        ["nesting_too_deep", "nesting_too_deep"],
    )
    assert [ln for _, ln in codes(result)] == [2, 3]


def test_huge_numbers_are_rejected_cleanly() -> None:
    huge_int = line("a")
    huge_int["body"]["seed"] = 10**30
    infinite = b'{"custom_id": "b", "body": {"seed": ' + b"9" * 400 + b"}}"
    result = run(jsonl(huge_int, infinite, line("c")))
    assert codes(result) == [("number_out_of_range", 1), ("number_out_of_range", 2)]


def test_only_first_errors_are_kept_but_all_are_counted() -> None:
    data = jsonl(*(b"bad" for _ in range(30)))
    result = run(data, max_errors=5)
    assert len(result.errors) == 5
    assert result.error_count == 30
    assert result.errors_object()["data"][0] == {
        "code": "invalid_json_line",
        "message": result.errors[0].message,
        "param": None,
        "line": 1,
    }


def test_error_codes_are_stable_strings() -> None:
    assert {c.value for c in ErrorCode} >= {
        "invalid_json_line",
        "duplicate_custom_id",
        "mismatched_url",
        "mismatched_model",
        "too_many_requests",
        "file_too_large",
        "line_too_large",
        "missing_output_token_limit",
        "empty_file",
    }


def test_iter_lines_numbers_lines_and_strips_bom_and_cr() -> None:
    data = b"\xef\xbb\xbfa\r\n\nb\n  \nc"
    pieces = [data[i : i + 2] for i in range(0, len(data), 2)]
    assert list(iter_lines(pieces)) == [(1, b"a"), (3, b"b"), (5, b"c")]
    assert list(iter_lines([b"x\ny\n"], first_line=10)) == [(10, b"x"), (11, b"y")]


def test_completions_are_bounded_by_max_tokens_only() -> None:
    """/v1/completions has no max_completion_tokens (vLLM would stop at its own 16 tokens)."""

    def completion(custom_id: str, **limit: int) -> dict[str, Any]:
        body = {"model": "m", "prompt": "hi", **limit}
        return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": body}

    data = jsonl(completion("a", max_tokens=5), completion("b", max_completion_tokens=7))
    loose = run(data, endpoint=COMPLETIONS)
    assert loose.ok
    assert (loose.declared_output_tokens, loose.requests_without_output_limit) == (5, 1)
    strict = run(data, endpoint=COMPLETIONS, require_output_token_limit=True)
    assert codes(strict) == [("missing_output_token_limit", 2)]
    assert strict.errors[0].param == "body.max_tokens"
    assert "max_tokens" in strict.errors[0].message
    assert "max_completion_tokens" not in strict.errors[0].message


def test_pools_require_an_output_token_limit_by_default() -> None:
    """Seed 000: every row needs an output-token limit unless a private pool relaxes it."""
    from llmbatch.api.resources import BatchPoolSpec

    spec = BatchPoolSpec.model_validate({"models": [{"name": "m", "source": "/m"}]})
    assert spec.limits.require_output_token_limit is True


def _blank_input(seed: int) -> bytes:
    """Requests among runs of blank and whitespace-only lines (and one long blank line)."""
    import random

    rng = random.Random(seed)
    parts: list[bytes] = []
    for i in range(40):
        parts.append(rng.choice([b"\n", b"\r\n", b" \t\n", b"\n" * rng.randint(2, 50)]))
        if rng.random() < 0.5:
            parts.append(json.dumps(line(f"r{i}")).encode() + b"\n")
    parts.append(b" " * 300 + b"\n")
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(8))
def test_blank_lines_count_the_same_whatever_the_chunks(seed: int) -> None:
    # Whitespace-only chunks take a fast path; lines, requests and the shard plan must be
    # exactly what line-by-line validation gives.
    data = _blank_input(seed)
    whole = validate_stream([data], endpoint=CHAT, shard_requests=3)
    for chunk in (1, 2, 3, 5, 17):
        pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
        cut = validate_stream(pieces, endpoint=CHAT, shard_requests=3)
        assert (cut.line_count, cut.request_count, cut.total_bytes) == (
            whole.line_count,
            whole.request_count,
            whole.total_bytes,
        )
        assert cut.shards == whole.shards
        assert codes(cut) == codes(whole)
    assert whole.line_count == data.count(b"\n")


def test_a_blank_head_costs_no_call_per_line() -> None:
    # #13 hole 5: 256 MiB of newlines must be answered in seconds; the validator used to spend
    # one Python call per blank line (~160 s of CPU). Counted, not timed.
    calls = 0

    class Counting(LineValidator):
        def _complete_line(self, raw: bytes, length: int) -> None:
            nonlocal calls
            calls += 1
            super()._complete_line(raw, length)

    validator = Counting(CHAT)
    piece = b"\n" * (1 << 20)
    for _ in range(64):
        assert validator.feed(piece)
    validator.feed(b" \r\n" * 1000 + json.dumps(line("a")).encode() + b"\n")
    result = validator.finish()
    assert calls <= 1001
    assert result.line_count == 64 * (1 << 20) + 1001
    assert result.request_count == 1
    assert [(s.first_line, s.request_count) for s in result.shards] == [(1, 1)]
