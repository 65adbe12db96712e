"""The inline ``requests`` of ``POST /v1/batches``, checked without I/O: each one as a line of
an input file would be (``core.validation``), measured for admission, and the 400s that name
the request (``requests[i]``) — at parse time, and once the pool is known for its output-token
and media rules."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict

from llmbatch.api.resources import BatchSpec, InlineRequest
from llmbatch.core.billing import BatchSize
from llmbatch.core.validation import (
    GENERATIVE_ENDPOINTS,
    OUTPUT_TOKEN_FIELDS_OF,
    ErrorCode,
    InvalidLine,
    MediaRules,
    MediaTally,
    ValidationLimits,
    check_request,
    media_problems,
)
from llmbatch.gateway.errors import APIError


class InlineRequestIn(BaseModel):
    """One inline request (the fields of an input line)."""

    model_config = ConfigDict(extra="allow")
    custom_id: Any = None
    method: Any = None
    url: Any = None
    body: Any = None


@dataclass(frozen=True)
class InlineInput:
    """What admission needs of inline requests, measured while they were checked."""

    size: BatchSize
    model: str | None
    first_unbounded: int | None = None
    """Index of the first request without an output-token limit (None: every one sets one);
    refused when the model's pool requires a limit (seed 000)."""


def check_inline(
    requests: list[InlineRequestIn], endpoint: str
) -> tuple[list[InlineRequest], InlineInput]:
    """Each request checked like a file line; the spec's items and their measured size."""
    if not requests:
        raise APIError(400, "'requests' must not be empty.", param="requests", code="empty_file")
    limits = ValidationLimits()
    seen: set[str] = set()
    model: str | None = None
    items: list[InlineRequest] = []
    input_bytes = declared = without = 0
    media = MediaTally()  # shapes now; the pool's media rules at admission (inline_media_error)
    first_unbounded: int | None = None
    for index, item in enumerate(requests):
        raw = item.model_dump()
        problems, line_model, output_tokens = check_request(
            raw, endpoint=endpoint, limits=limits, line=index + 1, media=media
        )
        problem = problems[0] if problems else None
        if problem is None and line_model is not None and model not in (None, line_model):
            problem = InvalidLine(
                "mismatched_model",  # type: ignore[arg-type]
                f"Every request must use one model: requests[{index}] uses {line_model!r}, "
                f"earlier ones use {model!r}.",
                index + 1,
                "body.model",
            )
        model = model or line_model
        custom_id, body = raw["custom_id"], raw["body"]
        if problem is None and custom_id in seen:
            problem = InvalidLine(
                "duplicate_custom_id",  # type: ignore[arg-type]
                f"custom_id {str(custom_id)[:64]!r} appears more than once.",
                index + 1,
                "custom_id",
            )
        if problem is not None:
            raise _inline_error(index, problem)
        seen.add(custom_id)
        items.append(InlineRequest(custom_id=custom_id, url=endpoint, body=body))
        # The size of the line the operator will store for it (what its estimate measures).
        line = {"custom_id": custom_id, "method": "POST", "url": endpoint, "body": body}
        input_bytes += 1 + len(orjson.dumps(line))
        if endpoint in GENERATIVE_ENDPOINTS:
            declared += output_tokens
            without += int(output_tokens == 0)
            if output_tokens == 0 and first_unbounded is None:
                first_unbounded = index
    size = BatchSize(input_bytes, len(items), declared, without, media)
    return items, InlineInput(size, model, first_unbounded)


def unbounded_inline_error(inline: InlineInput, endpoint: str) -> APIError | None:
    """The 400 for inline requests without an output-token limit, naming the first one."""
    if inline.first_unbounded is None:
        return None
    fields = OUTPUT_TOKEN_FIELDS_OF.get(endpoint, ("max_tokens",))
    problem = InvalidLine(
        ErrorCode.MISSING_OUTPUT_TOKEN_LIMIT,
        f"Every request needs an output-token limit ({' or '.join(fields)}).",
        inline.first_unbounded + 1,
        f"body.{fields[0]}",
    )
    return _inline_error(inline.first_unbounded, problem)


def inline_media_error(spec: BatchSpec, rules: MediaRules) -> APIError | None:
    """The 400 for the first inline request with an image or audio part the pool's model (or
    the platform's egress, or the pool's image caps) does not take: the rules of
    ``core.validation.media``, applied now that the pool is known (the shapes of the parts were
    checked when the requests were parsed)."""
    if spec.requests is None or rules == MediaRules():
        return None
    for index, item in enumerate(spec.requests):
        problems = media_problems(item.body, spec.endpoint, rules, MediaTally(), index + 1)
        if problems:
            return _inline_error(index, problems[0])
    return None


def _inline_error(index: int, problem: InvalidLine) -> APIError:
    return APIError(
        400,
        f"Invalid requests[{index}]: {problem.message}",
        param=f"requests[{index}]" + (f".{problem.param}" if problem.param else ""),
        code=str(problem.code),
    )


def inline_fingerprint(items: list[InlineRequest]) -> str:
    wire = [item.model_dump(by_alias=True) for item in items]
    digest = hashlib.sha256(orjson.dumps(wire, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return "inline-" + digest[:32]
