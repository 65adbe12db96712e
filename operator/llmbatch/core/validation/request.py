"""The rules one input line must follow on its own: a deliberate fast path, then the full checks."""

from __future__ import annotations

from typing import Any

from llmbatch.core.validation.errors import NUMBER_MESSAGE, ErrorCode, InvalidLine
from llmbatch.core.validation.limits import (
    GENERATIVE_ENDPOINTS,
    OUTPUT_TOKEN_FIELDS_OF,
    ValidationLimits,
    normalize_endpoint,
)
from llmbatch.core.validation.media import MediaTally, media_problems
from llmbatch.core.validation.responses import RESPONSES, responses_body_problems

_NUMBER_LIMIT = float(2**63)
_COMPLETIONS = "/v1/completions"


def _scan_structure(value: Any, max_depth: int) -> ErrorCode | None:
    """Reject deep nesting and out-of-range numbers; level by level, so never a RecursionError.

    orjson turns integer literals beyond 64 bits into (lossy) floats; any number whose magnitude
    reaches 2**63 is rejected rather than passed on silently changed.
    """
    level: list[Any] = [value]
    depth = 1
    while level:
        if depth > max_depth:
            return ErrorCode.NESTING_TOO_DEEP
        deeper: list[Any] = []
        for item in level:
            for child in item.values() if type(item) is dict else item:
                kind = type(child)
                if kind is dict or kind is list:
                    deeper.append(child)
                elif kind is float and not -_NUMBER_LIMIT < child < _NUMBER_LIMIT:
                    return ErrorCode.NUMBER_OUT_OF_RANGE
        level = deeper
        depth += 1
    return None


def structure_problem(obj: Any, limits: ValidationLimits, line: int | None) -> InvalidLine | None:
    """The line's nesting deeper than ``limits.max_json_depth`` or a number beyond 64 bits, as
    its problem; None when neither. Checked before anything else reads or encodes it."""
    code = _scan_structure(obj, limits.max_json_depth)
    return None if code is None else _structure_problem(code, limits, line)


def _structure_problem(code: ErrorCode, limits: ValidationLimits, line: int | None) -> InvalidLine:
    if code is ErrorCode.NESTING_TOO_DEEP:
        msg = f"JSON nests deeper than {limits.max_json_depth} levels."
        return InvalidLine(code, msg, line)
    return InvalidLine(code, NUMBER_MESSAGE.format(line=line), line)


def check_request(
    obj: Any,
    *,
    endpoint: str,
    limits: ValidationLimits,
    line: int | None = None,
    media: MediaTally | None = None,
) -> tuple[list[InvalidLine], str | None, int]:
    """Check one parsed line on its own (no cross-line rules).

    Returns the problems, the line's model (when readable) and its declared output-token limit.
    The body's content parts are always checked (``media``: the allow-list of shapes, and
    ``limits.media`` for its image and audio parts), on the parsed line so that every spelling
    of a key is seen; its media are tallied into ``media`` when given.
    """
    problems, model, output_tokens = _check(obj, endpoint, limits, line)
    body = obj.get("body") if type(obj) is dict else None
    if type(body) is dict:
        tally = media if media is not None else MediaTally()
        problems = problems + media_problems(body, endpoint, limits.media, tally, line)
    return problems, model, output_tokens


def _check(
    obj: Any, endpoint: str, limits: ValidationLimits, line: int | None
) -> tuple[list[InvalidLine], str | None, int]:
    """The line's envelope and body rules: the fast path for the usual line, else in full."""
    if type(obj) is not dict:
        msg = f"Line {line} is not a JSON object." if line else "The line is not a JSON object."
        return [InvalidLine(ErrorCode.INVALID_JSON_LINE, msg, line)], None, 0
    structural = structure_problem(obj, limits, line)
    if structural is not None:
        return [structural], None, 0

    custom_id = obj.get("custom_id")
    url = obj.get("url")
    body = obj.get("body")
    # Fast path for the usual, valid line; anything unusual takes the full checks below.
    # /v1/responses bodies have rules of their own (input, stateful fields): always the full path.
    if (
        endpoint != RESPONSES
        and type(custom_id) is str
        and 0 < len(custom_id) <= limits.max_custom_id_length
        and (url == endpoint or url == "/openai" + endpoint)
        and obj.get("method") == "POST"
        and type(body) is dict
    ):
        fast_model = body.get("model")
        if type(fast_model) is str and fast_model and body.get("stream") is not True:
            if endpoint not in GENERATIVE_ENDPOINTS:
                return [], fast_model, 0
            limit = None if endpoint == _COMPLETIONS else body.get("max_completion_tokens")
            if limit is None:
                limit = body.get("max_tokens")
            if type(limit) is int and limit > 0 and body.get("max_tokens") in (None, limit):
                return [], fast_model, limit
            if limit is None and not limits.require_output_token_limit:
                return [], fast_model, 0

    problems = _envelope_problems(obj, custom_id, url, endpoint, limits, line)
    if not isinstance(body, dict):
        msg = "body must be a JSON object."
        problems.append(InvalidLine(ErrorCode.INVALID_BODY, msg, line, "body"))
        return problems, None, 0
    body_problems, model, output_tokens = _body_problems(body, endpoint, limits, line)
    return problems + body_problems, model, output_tokens


def _envelope_problems(
    obj: dict[str, Any],
    custom_id: Any,
    url: Any,
    endpoint: str,
    limits: ValidationLimits,
    line: int | None,
) -> list[InvalidLine]:
    """The line's own fields: custom_id, method and url."""
    problems: list[InvalidLine] = []
    if custom_id is None:
        problems.append(
            InvalidLine(ErrorCode.MISSING_CUSTOM_ID, "Missing custom_id.", line, "custom_id")
        )
    elif not isinstance(custom_id, str) or not custom_id:
        msg = "custom_id must be a non-empty string."
        problems.append(InvalidLine(ErrorCode.INVALID_CUSTOM_ID, msg, line, "custom_id"))
    elif len(custom_id) > limits.max_custom_id_length:
        msg = f"custom_id is longer than {limits.max_custom_id_length} characters."
        problems.append(InvalidLine(ErrorCode.INVALID_CUSTOM_ID, msg, line, "custom_id"))

    method = obj.get("method")
    if method != "POST":
        msg = f"method must be POST, got {method!r}."
        problems.append(InvalidLine(ErrorCode.INVALID_METHOD, msg, line, "method"))

    if url is None:
        problems.append(InvalidLine(ErrorCode.MISSING_URL, "Missing url.", line, "url"))
    elif url != endpoint and (not isinstance(url, str) or normalize_endpoint(url) != endpoint):
        msg = f"url {url!r} does not match the batch endpoint {endpoint}."
        problems.append(InvalidLine(ErrorCode.MISMATCHED_URL, msg, line, "url"))
    return problems


def _body_problems(
    body: dict[str, Any], endpoint: str, limits: ValidationLimits, line: int | None
) -> tuple[list[InvalidLine], str | None, int]:
    """The request body: its model, no streaming, the endpoint's own rules (``responses``) and
    the output-token limits it declares."""
    problems: list[InvalidLine] = []
    model: str | None = None
    raw_model = body.get("model")
    if not isinstance(raw_model, str) or not raw_model:
        msg = "body.model must be a non-empty string."
        problems.append(InvalidLine(ErrorCode.MISSING_MODEL, msg, line, "body.model"))
    else:
        model = raw_model
    if body.get("stream") is True:
        msg = "Streaming is not supported in a batch (body.stream must not be true)."
        problems.append(InvalidLine(ErrorCode.STREAM_NOT_SUPPORTED, msg, line, "body.stream"))
    if endpoint == RESPONSES:
        problems += responses_body_problems(body, line)
    output_tokens = 0
    if endpoint in GENERATIVE_ENDPOINTS:
        limit_problems, output_tokens = _output_limit_problems(body, endpoint, limits, line)
        problems += limit_problems
    return problems, model, output_tokens


def _output_limit_problems(
    body: dict[str, Any], endpoint: str, limits: ValidationLimits, line: int | None
) -> tuple[list[InvalidLine], int]:
    """The endpoint's output-token fields: positive integers, one required when the pool says so.

    Returns the problems and the largest limit declared (0 when none is usable).
    """
    problems: list[InvalidLine] = []
    output_tokens = 0
    fields = OUTPUT_TOKEN_FIELDS_OF[endpoint]
    present = [f for f in fields if body.get(f) is not None]
    for name in present:
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            msg = f"body.{name} must be a positive integer."
            problems.append(
                InvalidLine(ErrorCode.INVALID_OUTPUT_TOKEN_LIMIT, msg, line, f"body.{name}")
            )
        else:
            output_tokens = max(output_tokens, value)
    if not present and limits.require_output_token_limit:
        msg = f"Every request needs an output-token limit ({' or '.join(fields)})."
        problems.append(
            InvalidLine(ErrorCode.MISSING_OUTPUT_TOKEN_LIMIT, msg, line, f"body.{fields[0]}")
        )
    return problems, output_tokens
