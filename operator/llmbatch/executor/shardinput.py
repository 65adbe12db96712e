"""The input of one shard run: its byte range's lines, and each line as an engine request.

A read that fails (a store blip, a dropped stream) is opened again right after the last
complete line, with backoff, for the shard's ``store_retry_seconds``: one slow read costs that
run a pause, not an attempt; only a store that stays down ends the run (``STORE_FAILED``), and
never its slot.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import orjson
from pydantic import ValidationError

from llmbatch.api.openai import BatchRequestLine
from llmbatch.api.shard import ShardSpec
from llmbatch.core.ids import request_id
from llmbatch.core.tiers import TIER_RANK
from llmbatch.core.validation import LineSplitter, normalize_endpoint, with_output_limit
from llmbatch.executor.engines.base import EngineRequest
from llmbatch.storage.base import ObjectStore, StoreError

log = logging.getLogger("llmbatch.executor")

#: Endpoints whose engine requests take vLLM's ``cache_salt`` (prefix caching applies to them).
SALTED_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


class BadLine(Exception):
    """A line that cannot run: it becomes a 400 error line naming the line."""

    def __init__(self, custom_id: str, message: str, param: str | None) -> None:
        super().__init__(message)
        self.custom_id = custom_id
        self.message = message
        self.param = param


async def range_lines(store: ObjectStore, spec: ShardSpec) -> AsyncIterator[tuple[int, bytes]]:
    """``(line number, line)`` of the shard's range, resuming a failed read; raises
    :class:`StoreError` once reads have failed for ``store_retry_seconds``."""
    offset, first_line = spec.start, spec.first_line
    delay, failing_since = 0.25, None
    while True:
        splitter = LineSplitter(first_line)
        try:
            chunks = await asyncio.to_thread(store.iter_range, spec.input_key, offset, spec.end)
            while (chunk := await asyncio.to_thread(next, chunks, None)) is not None:
                failing_since = None
                for line in splitter.feed(chunk):
                    yield line
            for line in splitter.finish():
                yield line
            return
        except StoreError as exc:
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= spec.store_retry_seconds:
                raise
            log.warning(
                "shard %s: input unreadable at byte %d (%s); again in %.2f s",
                spec.shard_index,
                offset + splitter.consumed,
                exc,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        # Resume right after the last complete line (a partial one is read again).
        offset, first_line = offset + splitter.consumed, splitter.number + 1


def parse_line(spec: ShardSpec, line_no: int, raw: bytes) -> EngineRequest:
    """The engine request of one input line; :class:`BadLine` for a line that cannot run."""
    custom_id = f"__line_{line_no}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadLine(custom_id, f"Line {line_no} is not valid JSON: {exc}", None) from exc
    if isinstance(value, dict) and isinstance(value.get("custom_id"), str):
        custom_id = value["custom_id"]
    try:
        line = BatchRequestLine.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ())) or None
        raise BadLine(custom_id, f"Line {line_no}: {first.get('msg')}", param) from exc
    if normalize_endpoint(line.url) != spec.endpoint:
        message = f"Line {line_no}: url {line.url!r} is not the batch endpoint {spec.endpoint}."
        raise BadLine(custom_id, message, "url")
    if line.body.get("stream") is True:
        raise BadLine(custom_id, f"Line {line_no}: stream is not supported.", "body.stream")
    body = with_output_limit(line.body, spec.endpoint, spec.default_output_tokens)
    if spec.cache_salt and spec.endpoint in SALTED_ENDPOINTS:
        # The tenant's salt replaces any the line brings: a request can never name another
        # tenant's salt to probe whether a prefix of theirs is cached.
        body = {**body, "cache_salt": spec.cache_salt}
    return EngineRequest(
        custom_id=line.custom_id,
        url=spec.endpoint,
        body=body,
        request_id=request_id(spec.batch_uid, line.custom_id),
        priority=TIER_RANK[spec.tier],
    )
