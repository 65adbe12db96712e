"""The ``/v1/responses`` body rules a batch needs: an ``input``, and no stateful feature.

A batch line is one self-contained request answered once, into a file. Features of the Responses
API that need server-side state or a later fetch cannot be honoured there, so they are refused
with the line's number rather than silently dropped:

* ``previous_response_id`` and ``conversation`` continue a stored conversation;
* ``background: true`` asks for a response object to poll later;
* ``prompt`` references a stored prompt template.

``store`` is accepted and ignored: nothing is stored (the executor's vLLM runs with its response
store disabled), the batch output file is the only copy of each response. ``stream: true`` and the
output-token limit (``max_output_tokens``) are the endpoint-independent rules of ``request``.
"""

from __future__ import annotations

from typing import Any

from llmbatch.core.validation.errors import ErrorCode, InvalidLine

RESPONSES = "/v1/responses"

_STATEFUL: tuple[tuple[str, str], ...] = (
    ("previous_response_id", "continues a stored response"),
    ("conversation", "continues a stored conversation"),
    ("prompt", "references a stored prompt template"),
)
"""Fields refused when set (not null), and why a batch cannot honour them."""


def responses_body_problems(body: dict[str, Any], line: int | None) -> list[InvalidLine]:
    """The problems of a ``/v1/responses`` body beyond the common ones (model, stream, limit)."""
    problems: list[InvalidLine] = []
    value = body.get("input")
    if value is None:
        msg = "body.input is required (a string or a list of input items)."
        problems.append(InvalidLine(ErrorCode.MISSING_INPUT, msg, line, "body.input"))
    elif not _is_input(value):
        msg = "body.input must be a non-empty string or a non-empty list of items."
        problems.append(InvalidLine(ErrorCode.INVALID_INPUT, msg, line, "body.input"))
    for name, why in _STATEFUL:
        if body.get(name) is not None:
            msg = f"body.{name} is not supported in a batch: it {why}."
            problems.append(InvalidLine(ErrorCode.UNSUPPORTED_PARAMETER, msg, line, f"body.{name}"))
    if body.get("background") is True:
        msg = (
            "body.background is not supported in a batch: the batch already runs in the "
            "background and its output file holds the response."
        )
        problems.append(InvalidLine(ErrorCode.UNSUPPORTED_PARAMETER, msg, line, "body.background"))
    return problems


def _is_input(value: Any) -> bool:
    """A non-empty string, or a non-empty list of items (objects, or strings)."""
    if isinstance(value, str):
        return bool(value)
    if isinstance(value, list):
        return bool(value) and all(isinstance(item, dict | str) for item in value)
    return False
