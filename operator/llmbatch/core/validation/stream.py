"""The streaming validator: bytes in chunk by chunk, a verdict and a shard plan out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from llmbatch.core.validation.errors import (
    ErrorCode,
    InvalidLine,
    UnsupportedEndpoint,
    decode_problem,
    line_too_large,
)
from llmbatch.core.validation.limits import (
    GENERATIVE_ENDPOINTS,
    SUPPORTED_ENDPOINTS,
    ValidationLimits,
    normalize_endpoint,
)
from llmbatch.core.validation.lines import clean_line
from llmbatch.core.validation.media import MediaTally
from llmbatch.core.validation.request import check_request
from llmbatch.core.validation.shards import ShardCutter, ShardRange


@dataclass
class ValidationResult:
    """What the validator learned about a file."""

    errors: list[InvalidLine]
    error_count: int
    request_count: int
    line_count: int
    total_bytes: int
    model: str | None
    shards: list[ShardRange]
    declared_output_tokens: int
    """Sum of the output-token limits the lines declare (an upper bound for cost estimates)."""
    aborted: bool
    """True when a whole-file limit (size, request count) stopped reading early."""
    requests_without_output_limit: int = 0
    """Requests to a generative endpoint that declare no output-token limit."""
    media: MediaTally = field(default_factory=MediaTally)
    """The image and audio parts of the valid lines (the estimate counts them by their rule)."""

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def errors_object(self) -> dict[str, Any]:
        """The OpenAI Batch ``errors`` object."""
        return {"object": "list", "data": [e.as_dict() for e in self.errors]}


class LineValidator:
    """Feed bytes; read the verdict from :meth:`finish`. Memory stays bounded by one line."""

    def __init__(
        self,
        endpoint: str,
        limits: ValidationLimits | None = None,
        *,
        shard_requests: int = 1000,
    ) -> None:
        normalized = normalize_endpoint(endpoint)
        if normalized is None:
            raise UnsupportedEndpoint(
                f"Unsupported endpoint {endpoint!r}; supported: {', '.join(SUPPORTED_ENDPOINTS)}."
            )
        if shard_requests < 1:
            raise ValueError("shard_requests must be at least 1")
        self.endpoint = normalized
        self.limits = limits or ValidationLimits()
        self._cutter = ShardCutter(shard_requests)
        self._errors: list[InvalidLine] = []
        self._error_count = 0
        self._pending = b""  # the unfinished last line
        self._skipping = False  # inside a line already reported too large
        self._offset = 0  # byte offset of the start of the pending line
        self._line = 0  # number of the last completed line
        self._requests = 0
        self._seen: set[str] = set()
        self._model: str | None = None
        self._output_tokens = 0
        self._unlimited = 0
        self._media = MediaTally()
        self._total = 0
        self._skipped_bytes = 0
        self.aborted = False

    # -- reporting -------------------------------------------------------------------------
    def _report(self, problem: InvalidLine) -> None:
        self._error_count += 1
        if len(self._errors) < self.limits.max_errors:
            self._errors.append(problem)

    def _abort(self, problem: InvalidLine) -> None:
        self._report(problem)
        self.aborted = True
        self._pending = b""

    # -- input -----------------------------------------------------------------------------
    def feed(self, chunk: bytes) -> bool:
        """Take the next bytes of the file. Returns False once reading further is pointless."""
        if self.aborted:
            return False
        self._total += len(chunk)
        if self._total > self.limits.max_bytes:
            self._abort(
                InvalidLine(
                    ErrorCode.FILE_TOO_LARGE,
                    f"The file is larger than {self.limits.max_bytes} bytes.",
                )
            )
            return False
        data = chunk
        if self._skipping:
            cut = data.find(b"\n")
            if cut < 0:
                self._skipped_bytes += len(data)
                return True
            self._end_skipped_line(cut)
            data = data[cut + 1 :]
        buffer = self._pending + data if self._pending else data
        if not buffer.strip():
            # Only whitespace (say 256 MiB of newlines): every complete line is blank. Count
            # them at C speed instead of one Python call per line.
            self._blank_lines(buffer)
            return True
        lines = buffer.split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            if not raw:  # an empty line: nothing to parse
                self._line += 1
                self._offset += 1
                self._cutter.add_blank_lines(1)
                continue
            self._complete_line(raw, len(raw) + 1)
            if self.aborted:
                return False
        if len(self._pending) > self.limits.max_line_bytes:
            self._report(line_too_large(self._line + 1, self.limits.max_line_bytes))
            self._skipping = True
            self._skipped_bytes = len(self._pending)
            self._pending = b""
        return True

    def _blank_lines(self, buffer: bytes) -> None:
        """Account for the complete lines of an all-whitespace ``buffer``; keep its tail."""
        last = buffer.rfind(b"\n")
        if last >= 0:
            count = buffer.count(b"\n", 0, last + 1)
            self._line += count
            self._offset += last + 1
            self._cutter.add_blank_lines(count)
        self._pending = buffer[last + 1 :]
        if len(self._pending) > self.limits.max_line_bytes:
            self._report(line_too_large(self._line + 1, self.limits.max_line_bytes))
            self._skipping = True
            self._skipped_bytes = len(self._pending)
            self._pending = b""

    def _end_skipped_line(self, tail: int) -> None:
        self._skipping = False
        length = self._skipped_bytes + tail + 1
        self._line += 1
        self._offset += length
        self._count_request()
        if not self.aborted:
            self._cutter.add_line(True, self._offset)

    def _complete_line(self, raw: bytes, length: int) -> None:
        """Account for one physical line of ``length`` bytes (with its newline, if any)."""
        self._line += 1
        line_no = self._line
        self._offset += length
        text = clean_line(raw, line_no)
        if not text:
            self._cutter.add_line(False, self._offset)
            return
        self._count_request()
        if self.aborted:
            return
        self._cutter.add_line(True, self._offset)
        if len(text) > self.limits.max_line_bytes:
            self._report(line_too_large(line_no, self.limits.max_line_bytes))
            return
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            self._report(decode_problem(text, line_no, exc))
            return
        problems, model, output_tokens = check_request(
            obj,
            endpoint=self.endpoint,
            limits=self.limits,
            line=line_no,
            media=self._media,
        )
        for problem in problems:
            self._report(problem)
        self._output_tokens += output_tokens
        if output_tokens == 0 and self.endpoint in GENERATIVE_ENDPOINTS:
            self._unlimited += 1
        # Cross-line rules; the usual line (same model, new custom_id) costs two comparisons.
        if model is not None and model != self._model:
            self._settle_model(model, line_no)
        custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
        if isinstance(custom_id, str) and custom_id:
            if custom_id in self._seen:
                self._report_duplicate(custom_id, line_no)
            else:
                self._seen.add(custom_id)

    def _settle_model(self, model: str, line_no: int) -> None:
        """The first line's model is the file's; any other model is a problem."""
        if self._model is None:
            self._model = model
            return
        self._report(
            InvalidLine(
                ErrorCode.MISMATCHED_MODEL,
                f"Every line must use one model: line {line_no} uses {model!r}, "
                f"earlier lines use {self._model!r}.",
                line_no,
                "body.model",
            )
        )

    def _report_duplicate(self, custom_id: str, line_no: int) -> None:
        self._report(
            InvalidLine(
                ErrorCode.DUPLICATE_CUSTOM_ID,
                f"custom_id {custom_id[:64]!r} appears more than once.",
                line_no,
                "custom_id",
            )
        )

    def _count_request(self) -> None:
        self._requests += 1
        if self._requests > self.limits.max_requests:
            self._abort(
                InvalidLine(
                    ErrorCode.TOO_MANY_REQUESTS,
                    f"The file has more than {self.limits.max_requests} requests.",
                    self._line,
                )
            )

    def finish(self) -> ValidationResult:
        """End of input: settle the last line and return the verdict."""
        if not self.aborted:
            if self._skipping:
                self._end_skipped_line(-1)
            elif self._pending:
                raw, self._pending = self._pending, b""
                self._complete_line(raw, len(raw))
        if not self.aborted:
            self._cutter.close(self._offset)
            if self._requests == 0 and self._error_count == 0:
                self._report(InvalidLine(ErrorCode.EMPTY_FILE, "The file has no requests."))
        return ValidationResult(
            errors=list(self._errors),
            error_count=self._error_count,
            request_count=self._requests,
            line_count=self._line,
            total_bytes=self._total,
            model=self._model,
            shards=[] if self.aborted else list(self._cutter.shards),
            declared_output_tokens=self._output_tokens,
            aborted=self.aborted,
            requests_without_output_limit=self._unlimited,
            media=self._media,
        )


def validate_stream(
    chunks: Iterable[bytes],
    *,
    endpoint: str,
    limits: ValidationLimits | None = None,
    shard_requests: int = 1000,
) -> ValidationResult:
    """Validate a whole file given as chunks; stops reading at a whole-file limit."""
    validator = LineValidator(endpoint, limits, shard_requests=shard_requests)
    for chunk in chunks:
        if not validator.feed(chunk):
            break
    return validator.finish()
