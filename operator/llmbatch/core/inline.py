"""Inline requests (``POST /v1/batches`` with ``requests``, or a Batch's ``spec.requests``) as
the JSONL input file they stand for: one rule, written by the gateway at creation and by the
operator for a Batch applied with kubectl, read like any upload."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from llmbatch.api.resources import InlineRequest
from llmbatch.core.validation import InvalidLine, ValidationLimits, structure_problem


@dataclass(frozen=True)
class InlineFile:
    """The JSONL bytes of inline requests, their count and digest."""

    data: bytes
    requests: int
    sha256: str


class InvalidInlineRequest(ValueError):
    """An inline request no input line may be (nested too deep, a number beyond 64 bits): it is
    refused before it is encoded, as the validator refuses such a line of a file."""

    def __init__(self, problem: InvalidLine) -> None:
        super().__init__(problem.message)
        self.problem = problem


def inline_file(requests: Iterable[InlineRequest]) -> InlineFile:
    """The requests as one JSONL line each (``custom_id``, ``method``, ``url``, ``body``);
    :class:`InvalidInlineRequest` for the first whose structure no line may have (the line's
    number is its 1-based place)."""
    limits = ValidationLimits()
    lines = []
    for number, r in enumerate(requests, start=1):
        line = {"custom_id": r.custom_id, "method": r.method, "url": r.url, "body": r.body}
        problem = structure_problem(line, limits, number)
        if problem is not None:
            raise InvalidInlineRequest(problem)
        lines.append(orjson.dumps(line) + b"\n")
    data = b"".join(lines)
    return InlineFile(data, len(lines), hashlib.sha256(data).hexdigest())
