"""Inline requests (``POST /v1/batches`` with ``requests``, or a Batch's ``spec.requests``) as
the JSONL input file they stand for: one rule, written by the gateway at creation and by the
operator for a Batch applied with kubectl, read like any upload."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from llmbatch.api.resources import InlineRequest


@dataclass(frozen=True)
class InlineFile:
    """The JSONL bytes of inline requests, their count and digest."""

    data: bytes
    requests: int
    sha256: str


def inline_file(requests: Iterable[InlineRequest]) -> InlineFile:
    """The requests as one JSONL line each (``custom_id``, ``method``, ``url``, ``body``)."""
    lines = [
        orjson.dumps({"custom_id": r.custom_id, "method": r.method, "url": r.url, "body": r.body})
        + b"\n"
        for r in requests
    ]
    data = b"".join(lines)
    return InlineFile(data, len(lines), hashlib.sha256(data).hexdigest())
