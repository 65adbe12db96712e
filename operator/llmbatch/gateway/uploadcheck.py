"""Validation of an upload whose endpoint is named by its first non-blank line.

``UploadChecker`` settles the endpoint from the first line, then validates every line with
``llmbatch.core.validation`` and stops at the first problem (:class:`BadLine`).
"""

from __future__ import annotations

import re

import orjson

from llmbatch.core.validation import (
    UTF8_BOM,
    ErrorCode,
    InvalidLine,
    LineValidator,
    ValidationLimits,
    ValidationResult,
    normalize_endpoint,
)
from llmbatch.gateway.errors import APIError

DEFAULT_ENDPOINT = "/v1/chat/completions"
_VISIBLE = re.compile(rb"[^ \t\n\r\x0b\x0c]")  # what bytes.strip() keeps


class BadLine(Exception):
    """The first problem found in an upload."""

    def __init__(self, problem: InvalidLine) -> None:
        super().__init__(problem.message)
        self.problem = problem


class _FailFast(LineValidator):
    """A validator that stops at the first problem."""

    def _report(self, problem: InvalidLine) -> None:
        raise BadLine(problem)


def bad_line_error(problem: InvalidLine) -> APIError:
    message = problem.message
    if problem.line is not None and f"Line {problem.line}" not in message:
        message = f"Line {problem.line}: {message}"
    return APIError(400, message, param=problem.param or "file", code=str(problem.code))


class UploadChecker:
    """Validates an upload whose endpoint is not known up front.

    The endpoint is the (normalised) ``url`` of the first non-blank line; every other line must
    use the same one. Until that line is complete, each byte is looked at once: blank lines go
    straight on to the validator (they need no endpoint) and only the unfinished current line is
    held (at most ``max_line_bytes``), so a head of blank lines costs linear time and no memory.
    """

    def __init__(self, limits: ValidationLimits) -> None:
        self.limits = limits
        self.endpoint: str | None = None
        self.scanned = 0
        """Bytes the endpoint sniff has looked at: at most twice the head, whatever its pieces."""
        # Its endpoint is settled before it sees a non-blank line (it reads it per line).
        self._validator = _FailFast(DEFAULT_ENDPOINT, limits)
        self._held = bytearray()  # the current, unfinished line (not yet fed)
        self._lines = 0  # complete (blank) lines fed so far
        self._visible = False  # the held line has content: it is the first line

    def feed(self, chunk: bytes) -> None:
        if self.endpoint is not None:
            self._validator.feed(chunk)
        elif self._visible:
            self._read_first_line(chunk, 0)
        else:
            self._skip_blank_lines(chunk)

    def finish(self) -> ValidationResult:
        if self.endpoint is None:
            endpoint = DEFAULT_ENDPOINT
            if self._visible:  # a first line without a final newline
                endpoint = self._endpoint_of(bytes(self._held), self._lines + 1)
            self._settle(endpoint)
        return self._validator.finish()

    def _skip_blank_lines(self, chunk: bytes) -> None:
        """Feed the complete blank lines at the start of ``chunk``; hold the rest of it."""
        start = 0
        if not self._lines and len(self._held) < len(UTF8_BOM) and UTF8_BOM.startswith(self._held):
            done = len(self._held)  # the file may open with a UTF-8 BOM: not content
            head = chunk[: len(UTF8_BOM) - done]
            if UTF8_BOM[done:].startswith(head):
                start = len(head)
            elif done:  # what looked like a BOM is content: the first line has begun
                self._visible = True
                self._read_first_line(chunk, 0)
                return
        found = _VISIBLE.search(chunk, start)
        end = found.start() if found is not None else len(chunk)
        line_start = chunk.rfind(b"\n", 0, end) + 1
        self.scanned += (end - start) + (end - line_start) + line_start  # search, rfind, count
        if line_start:
            self._lines += chunk.count(b"\n", 0, line_start)
            if self._held:
                self._validator.feed(bytes(self._held))
                self._held = bytearray()
            self._validator.feed(chunk[:line_start])
        if found is None:
            self._hold(chunk[line_start:])
            return
        self._visible = True
        self._read_first_line(chunk[line_start:], end - line_start)

    def _read_first_line(self, data: bytes, searched: int) -> None:
        """Hold ``data`` until the first non-blank line ends, then settle the endpoint."""
        cut = data.find(b"\n", searched)
        self.scanned += (len(data) if cut < 0 else cut) - searched
        if cut < 0:
            self._hold(data)
            return
        line = bytes(self._held) + data[:cut]
        self._held += data
        self._settle(self._endpoint_of(line, self._lines + 1))

    def _hold(self, data: bytes) -> None:
        self._held += data
        if len(self._held) > self.limits.max_line_bytes:
            self._settle(DEFAULT_ENDPOINT)  # the validator reports the long line

    def _settle(self, endpoint: str) -> None:
        self.endpoint = self._validator.endpoint = endpoint
        held, self._held = bytes(self._held), bytearray()
        if held:
            self._validator.feed(held)

    @staticmethod
    def _endpoint_of(line: bytes, line_no: int) -> str:
        if line_no == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]
        raw = line.strip()
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return DEFAULT_ENDPOINT  # the validator reports the JSON problem
        url = obj.get("url") if isinstance(obj, dict) else None
        if not isinstance(url, str):
            return DEFAULT_ENDPOINT
        endpoint = normalize_endpoint(url)
        if endpoint is None:
            raise BadLine(
                InvalidLine(
                    ErrorCode.UNSUPPORTED_ENDPOINT,
                    f"Line {line_no}: url {url[:100]!r} is not a supported endpoint "
                    "(/v1/chat/completions, /v1/completions, /v1/embeddings, or /openai/v1/...).",
                    line_no,
                    "url",
                )
            )
        return endpoint
