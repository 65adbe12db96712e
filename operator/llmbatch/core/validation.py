"""Streaming validation of a batch input file, and the shard plan that falls out of it.

Bytes go in chunk by chunk (``LineValidator.feed``); the whole file is never held in memory. Every
line is checked against the OpenAI batch rules (``shared/openai-batch-contract.md``) plus our
limits; the first ``max_errors`` problems are kept with 1-based line numbers. While reading, the
validator also cuts the file into shards: contiguous byte ranges on line boundaries holding at most
``shard_requests`` requests each.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

UTF8_BOM = b"\xef\xbb\xbf"
_WHITESPACE = frozenset(b" \t\r\n\x0b\x0c")

SUPPORTED_ENDPOINTS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
OUTPUT_TOKEN_FIELDS: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
_GENERATIVE_ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions"})


class ErrorCode(enum.StrEnum):
    """Stable error codes of input validation (documented in docs/validation.md)."""

    EMPTY_FILE = "empty_file"
    INVALID_ENCODING = "invalid_encoding"
    INVALID_JSON_LINE = "invalid_json_line"
    NESTING_TOO_DEEP = "nesting_too_deep"
    LINE_TOO_LARGE = "line_too_large"
    FILE_TOO_LARGE = "file_too_large"
    TOO_MANY_REQUESTS = "too_many_requests"
    MISSING_CUSTOM_ID = "missing_custom_id"
    INVALID_CUSTOM_ID = "invalid_custom_id"
    DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    INVALID_METHOD = "invalid_method"
    MISSING_URL = "missing_url"
    MISMATCHED_URL = "mismatched_url"
    INVALID_BODY = "invalid_body"
    MISSING_MODEL = "missing_model"
    MISMATCHED_MODEL = "mismatched_model"
    STREAM_NOT_SUPPORTED = "stream_not_supported"
    MISSING_OUTPUT_TOKEN_LIMIT = "missing_output_token_limit"
    INVALID_OUTPUT_TOKEN_LIMIT = "invalid_output_token_limit"
    UNSUPPORTED_ENDPOINT = "unsupported_endpoint"
    NUMBER_OUT_OF_RANGE = "number_out_of_range"


_NUMBER_MESSAGE = "Line {line} has a number outside the 64-bit range."


@dataclass(frozen=True)
class InvalidLine:
    """One validation problem: OpenAI's ``{code, message, param, line}``."""

    code: ErrorCode
    message: str
    line: int | None = None
    param: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The OpenAI ``errors.data[]`` item."""
        return {
            "code": str(self.code),
            "message": self.message,
            "param": self.param,
            "line": self.line,
        }


class UnsupportedEndpoint(ValueError):
    """The batch endpoint itself is not one we serve."""


def normalize_endpoint(url: str) -> str | None:
    """``/openai/v1/x`` and ``/v1/x`` name the same endpoint; ``None`` when unsupported."""
    path = url.strip()
    if path.startswith("/openai/v1/"):
        path = path.removeprefix("/openai")
    path = path.rstrip("/")
    return path if path in SUPPORTED_ENDPOINTS else None


@dataclass(frozen=True)
class ValidationLimits:
    """Limits applied while validating; pools may lower them (see ``BatchPool.spec.limits``)."""

    max_requests: int = 50_000
    max_bytes: int = 200_000_000
    max_line_bytes: int = 8 * 1024 * 1024
    max_custom_id_length: int = 512
    max_json_depth: int = 64
    max_errors: int = 100
    require_output_token_limit: bool = False


@dataclass(frozen=True)
class ShardRange:
    """A contiguous byte range ``[start, end)`` of the input holding whole lines."""

    index: int
    start: int
    end: int
    first_line: int
    line_count: int
    request_count: int


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

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def errors_object(self) -> dict[str, Any]:
        """The OpenAI Batch ``errors`` object."""
        return {"object": "list", "data": [e.as_dict() for e in self.errors]}


_NUMBER_LIMIT = float(2**63)


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


def check_request(
    obj: Any,
    *,
    endpoint: str,
    limits: ValidationLimits,
    line: int | None = None,
) -> tuple[list[InvalidLine], str | None, int]:
    """Check one parsed line on its own (no cross-line rules).

    Returns the problems, the line's model (when readable) and its declared output-token limit.
    """
    problems: list[InvalidLine] = []
    if type(obj) is not dict:
        msg = f"Line {line} is not a JSON object." if line else "The line is not a JSON object."
        return [InvalidLine(ErrorCode.INVALID_JSON_LINE, msg, line)], None, 0
    structural = _scan_structure(obj, limits.max_json_depth)
    if structural is ErrorCode.NESTING_TOO_DEEP:
        msg = f"JSON nests deeper than {limits.max_json_depth} levels."
        return [InvalidLine(structural, msg, line)], None, 0
    if structural is ErrorCode.NUMBER_OUT_OF_RANGE:
        return [InvalidLine(structural, _NUMBER_MESSAGE.format(line=line), line)], None, 0

    custom_id = obj.get("custom_id")
    url = obj.get("url")
    body = obj.get("body")
    # Fast path for the usual, valid line; anything unusual takes the full checks below.
    if (
        type(custom_id) is str
        and 0 < len(custom_id) <= limits.max_custom_id_length
        and (url == endpoint or url == "/openai" + endpoint)
        and obj.get("method") == "POST"
        and type(body) is dict
    ):
        fast_model = body.get("model")
        if type(fast_model) is str and fast_model and body.get("stream") is not True:
            if endpoint not in _GENERATIVE_ENDPOINTS:
                return problems, fast_model, 0
            limit = body.get("max_completion_tokens")
            if limit is None:
                limit = body.get("max_tokens")
            if type(limit) is int and limit > 0 and body.get("max_tokens") in (None, limit):
                return problems, fast_model, limit
            if limit is None and not limits.require_output_token_limit:
                return problems, fast_model, 0

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

    model: str | None = None
    output_tokens = 0
    if not isinstance(body, dict):
        msg = "body must be a JSON object."
        problems.append(InvalidLine(ErrorCode.INVALID_BODY, msg, line, "body"))
        return problems, None, 0
    raw_model = body.get("model")
    if not isinstance(raw_model, str) or not raw_model:
        msg = "body.model must be a non-empty string."
        problems.append(InvalidLine(ErrorCode.MISSING_MODEL, msg, line, "body.model"))
    else:
        model = raw_model
    if body.get("stream") is True:
        msg = "Streaming is not supported in a batch (body.stream must not be true)."
        problems.append(InvalidLine(ErrorCode.STREAM_NOT_SUPPORTED, msg, line, "body.stream"))
    if endpoint in _GENERATIVE_ENDPOINTS:
        present = [f for f in OUTPUT_TOKEN_FIELDS if body.get(f) is not None]
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
            msg = "Every request needs an output-token limit (max_completion_tokens or max_tokens)."
            problems.append(
                InvalidLine(
                    ErrorCode.MISSING_OUTPUT_TOKEN_LIMIT, msg, line, "body.max_completion_tokens"
                )
            )
    return problems, model, output_tokens


@dataclass
class _ShardCutter:
    """Cuts line boundaries into shards of at most ``size`` requests."""

    size: int
    shards: list[ShardRange] = field(default_factory=list)
    start: int = 0
    first_line: int = 1
    lines: int = 0
    requests: int = 0

    def add_line(self, is_request: bool, end: int) -> None:
        self.lines += 1
        self.requests += int(is_request)
        if self.requests >= self.size:
            self.close(end)

    def close(self, end: int) -> None:
        if self.lines == 0:
            return
        if self.requests == 0 and self.shards:
            # Trailing blank lines join the last shard instead of making an empty one.
            last = self.shards[-1]
            self.shards[-1] = ShardRange(
                last.index,
                last.start,
                end,
                last.first_line,
                last.line_count + self.lines,
                last.request_count,
            )
            self.start, self.first_line = end, self.first_line + self.lines
            self.lines = 0
            return
        self.shards.append(
            ShardRange(
                len(self.shards), self.start, end, self.first_line, self.lines, self.requests
            )
        )
        self.start, self.first_line = end, self.first_line + self.lines
        self.lines = self.requests = 0


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
        self._cutter = _ShardCutter(shard_requests)
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
        lines = buffer.split(b"\n")
        self._pending = lines.pop()
        for raw in lines:
            self._complete_line(raw, len(raw) + 1)
            if self.aborted:
                return False
        if len(self._pending) > self.limits.max_line_bytes:
            self._report(
                InvalidLine(
                    ErrorCode.LINE_TOO_LARGE,
                    f"Line {self._line + 1} is longer than {self.limits.max_line_bytes} bytes.",
                    self._line + 1,
                )
            )
            self._skipping = True
            self._skipped_bytes = len(self._pending)
            self._pending = b""
        return True

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
        text = raw
        if line_no == 1 and text.startswith(UTF8_BOM):
            text = text[len(UTF8_BOM) :]
        if text.endswith(b"\r"):
            text = text[:-1]
        if not text or (text[0] in _WHITESPACE and not text.strip()):
            self._cutter.add_line(False, self._offset)
            return
        self._count_request()
        if self.aborted:
            return
        self._cutter.add_line(True, self._offset)
        if len(text) > self.limits.max_line_bytes:
            self._report(
                InvalidLine(
                    ErrorCode.LINE_TOO_LARGE,
                    f"Line {line_no} is longer than {self.limits.max_line_bytes} bytes.",
                    line_no,
                )
            )
            return
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            self._report(_decode_problem(text, line_no, exc))
            return
        problems, model, output_tokens = check_request(
            obj, endpoint=self.endpoint, limits=self.limits, line=line_no
        )
        for problem in problems:
            self._report(problem)
        self._output_tokens += output_tokens
        if output_tokens == 0 and self.endpoint in _GENERATIVE_ENDPOINTS:
            self._unlimited += 1
        if model is not None:
            if self._model is None:
                self._model = model
            elif model != self._model:
                self._report(
                    InvalidLine(
                        ErrorCode.MISMATCHED_MODEL,
                        f"Every line must use one model: line {line_no} uses {model!r}, "
                        f"earlier lines use {self._model!r}.",
                        line_no,
                        "body.model",
                    )
                )
        custom_id = obj.get("custom_id") if isinstance(obj, dict) else None
        if isinstance(custom_id, str) and custom_id:
            if custom_id in self._seen:
                self._report(
                    InvalidLine(
                        ErrorCode.DUPLICATE_CUSTOM_ID,
                        f"custom_id {custom_id[:64]!r} appears more than once.",
                        line_no,
                        "custom_id",
                    )
                )
            else:
                self._seen.add(custom_id)

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
        )


def _decode_problem(text: bytes, line: int, exc: orjson.JSONDecodeError) -> InvalidLine:
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as bad:
        return InvalidLine(
            ErrorCode.INVALID_ENCODING,
            f"Line {line} is not valid UTF-8 (byte {bad.start}).",
            line,
        )
    reason = str(exc).split(":", 1)[0]
    if "infinity" in reason:
        return InvalidLine(ErrorCode.NUMBER_OUT_OF_RANGE, _NUMBER_MESSAGE.format(line=line), line)
    return InvalidLine(
        ErrorCode.INVALID_JSON_LINE, f"Line {line} is not valid JSON: {reason}.", line
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


def iter_lines(chunks: Iterable[bytes], first_line: int = 1) -> Iterator[tuple[int, bytes]]:
    """Split a byte stream into ``(line_number, line)`` pairs without newline, CR or BOM.

    Blank lines are skipped (their numbers still count). Used by the executor on a shard range.
    """
    number = first_line - 1
    pending = b""
    for chunk in chunks:
        buffer = pending + chunk if pending else chunk
        parts = buffer.split(b"\n")
        pending = parts.pop()
        for raw in parts:
            number += 1
            text = _clean(raw, number)
            if text:
                yield number, text
    if pending:
        number += 1
        text = _clean(pending, number)
        if text:
            yield number, text


def _clean(raw: bytes, number: int) -> bytes:
    text = raw[len(UTF8_BOM) :] if number == 1 and raw.startswith(UTF8_BOM) else raw
    if text.endswith(b"\r"):
        text = text[:-1]
    return text if text.strip() else b""
