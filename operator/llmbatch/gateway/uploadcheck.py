"""Validation of an upload whose endpoint is named by its first non-blank line.

``UploadChecker`` settles the endpoint (and whether rows need an output-token limit, from the
first line's model) from the first line, then validates every line with
``llmbatch.core.validation`` and stops at the first problem (:class:`BadLine`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from llmbatch.api.openai import endpoint_list
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

    def __init__(
        self,
        limits: ValidationLimits,
        limits_for: Callable[[ValidationLimits, str | None], ValidationLimits] | None = None,
    ) -> None:
        self.limits = limits
        self.limits_for = limits_for
        """The limits the rows are checked against, from ``limits`` and the first line's model
        (None when it names none): whether the pool serving it wants every row to bound its
        output (seed 000), the media it accepts; asked once."""
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
            model = None
            if self._visible:  # a first line without a final newline
                endpoint, model = self._first_line(bytes(self._held), self._lines + 1)
            self._settle(endpoint, model)
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
        self._settle(*self._first_line(line, self._lines + 1))

    def _hold(self, data: bytes) -> None:
        self._held += data
        if len(self._held) > self.limits.max_line_bytes:
            self._settle(DEFAULT_ENDPOINT)  # the validator reports the long line

    def _settle(self, endpoint: str, model: str | None = None) -> None:
        self.endpoint = self._validator.endpoint = endpoint
        if self.limits_for is not None:
            self._validator.limits = self.limits_for(self.limits, model)
        held, self._held = bytes(self._held), bytearray()
        if held:
            self._validator.feed(held)

    @staticmethod
    def _first_line(line: bytes, line_no: int) -> tuple[str, str | None]:
        """The endpoint and the model the first non-blank line names."""
        if line_no == 1 and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM) :]
        raw = line.strip()
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return DEFAULT_ENDPOINT, None  # the validator reports the JSON problem
        if not isinstance(obj, dict):
            return DEFAULT_ENDPOINT, None
        model = _model_of(obj)
        url = obj.get("url")
        if not isinstance(url, str):
            return DEFAULT_ENDPOINT, model
        endpoint = normalize_endpoint(url)
        if endpoint is None:
            raise BadLine(
                InvalidLine(
                    ErrorCode.UNSUPPORTED_ENDPOINT,
                    f"Line {line_no}: url {url[:100]!r} is not a supported endpoint "
                    f"({endpoint_list('or')}, or their /openai/v1/... spellings).",
                    line_no,
                    "url",
                )
            )
        return endpoint, model


def _model_of(obj: dict[str, Any]) -> str | None:
    body = obj.get("body")
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


# --- expires_after ------------------------------------------------------------------------------

EXPIRES_ANCHOR_FIELD = "expires_after[anchor]"
EXPIRES_SECONDS_FIELD = "expires_after[seconds]"
"""The form fields the openai SDK sends for ``files.create(expires_after={...})``."""
MIN_EXPIRES_SECONDS = 3600
MAX_EXPIRES_SECONDS = 2_592_000


def expires_after_problem(name: str, value: str) -> APIError | None:
    """One ``expires_after[...]`` form field on its own: an anchor, a number of seconds."""
    if name == EXPIRES_ANCHOR_FIELD:
        if value != "created_at":
            return _expires_error(
                "anchor",
                f"Invalid value for 'expires_after.anchor': {value[:64]!r}. "
                "Supported value: 'created_at'.",
            )
        return None
    if name == EXPIRES_SECONDS_FIELD:
        seconds = int(value) if value.strip().isdigit() else None
        if seconds is None or not MIN_EXPIRES_SECONDS <= seconds <= MAX_EXPIRES_SECONDS:
            return _expires_error(
                "seconds",
                f"Invalid value for 'expires_after.seconds': {value[:64]!r}. Expected an integer "
                f"between {MIN_EXPIRES_SECONDS} and {MAX_EXPIRES_SECONDS} (1 hour to 30 days).",
            )
        return None
    return _expires_error(
        name.removeprefix("expires_after[").removesuffix("]")[:64],
        f"Unknown parameter: {name[:80]!r}. expires_after takes 'anchor' and 'seconds'.",
        code="unknown_parameter",
    )


def expires_after_seconds(fields: dict[str, str]) -> int | None:
    """The lifetime an upload asks for (None: the default); raises :class:`APIError` (400)."""
    given = {k: v for k, v in fields.items() if k.startswith("expires_after")}
    if not given:
        return None
    for name, value in given.items():
        problem = expires_after_problem(name, value)
        if problem is not None:
            raise problem
    for part, field in (("anchor", EXPIRES_ANCHOR_FIELD), ("seconds", EXPIRES_SECONDS_FIELD)):
        if field not in given:
            raise _expires_error(
                part, f"Missing required parameter: 'expires_after.{part}'.", code="missing"
            )
    return int(given[EXPIRES_SECONDS_FIELD])


def _expires_error(part: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=f"expires_after.{part}", code=code)
