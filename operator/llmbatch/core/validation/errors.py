"""The typed problems of input validation: stable codes and OpenAI's error items."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import orjson


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
    MISSING_INPUT = "missing_input"
    INVALID_INPUT = "invalid_input"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    UNSUPPORTED_MODALITY = "unsupported_modality"
    INVALID_MEDIA = "invalid_media"
    REMOTE_MEDIA_NOT_ALLOWED = "remote_media_not_allowed"
    UNSUPPORTED_CONTENT_PART = "unsupported_content_part"
    IMAGE_TOO_LARGE = "image_too_large"
    TOO_MANY_IMAGES = "too_many_images"


NUMBER_MESSAGE = "Line {line} has a number outside the 64-bit range."


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


def line_too_large(line: int, max_line_bytes: int) -> InvalidLine:
    """A line longer than the limit (it is skipped, not parsed)."""
    return InvalidLine(
        ErrorCode.LINE_TOO_LARGE, f"Line {line} is longer than {max_line_bytes} bytes.", line
    )


def decode_problem(text: bytes, line: int, exc: orjson.JSONDecodeError) -> InvalidLine:
    """Why orjson could not parse a line: bad UTF-8, a number beyond 64 bits, or bad JSON."""
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
        return InvalidLine(ErrorCode.NUMBER_OUT_OF_RANGE, NUMBER_MESSAGE.format(line=line), line)
    return InvalidLine(
        ErrorCode.INVALID_JSON_LINE, f"Line {line} is not valid JSON: {reason}.", line
    )
