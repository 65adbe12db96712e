"""Streaming validation of a batch input file, and the shard plan that falls out of it.

Bytes go in chunk by chunk (``LineValidator.feed``); the whole file is never held in memory. Every
line is checked against the OpenAI batch rules (``shared/openai-batch-contract.md``) plus our
limits; the first ``max_errors`` problems are kept with 1-based line numbers. While reading, the
validator also cuts the file into shards: contiguous byte ranges on line boundaries holding at most
``shard_requests`` requests each.

One module per concern: ``errors`` (typed problems), ``limits`` (endpoints and limits),
``request`` (one line on its own, fast path first), ``responses`` (the /v1/responses body rules),
``parts`` (the allow-list of content-part shapes), ``media`` (image and audio parts),
``imagesize`` (image headers), ``shards`` (the plan), ``lines`` (BOM, CRLF, blank lines) and
``stream`` (the validator that ties them together).
"""

from __future__ import annotations

from llmbatch.core.validation.errors import ErrorCode, InvalidLine, UnsupportedEndpoint
from llmbatch.core.validation.limits import (
    GENERATIVE_ENDPOINTS,
    OUTPUT_TOKEN_FIELDS,
    OUTPUT_TOKEN_FIELDS_OF,
    SUPPORTED_ENDPOINTS,
    ValidationLimits,
    normalize_endpoint,
    with_output_limit,
)
from llmbatch.core.validation.lines import UTF8_BOM, LineSplitter, iter_lines
from llmbatch.core.validation.media import (
    MODALITIES,
    MediaRules,
    MediaTally,
    image_problem,
    media_problems,
)
from llmbatch.core.validation.parts import MediaPart, content_parts
from llmbatch.core.validation.request import check_request, structure_problem
from llmbatch.core.validation.shards import ShardRange
from llmbatch.core.validation.stream import LineValidator, ValidationResult, validate_stream

__all__ = [
    "GENERATIVE_ENDPOINTS",
    "MODALITIES",
    "OUTPUT_TOKEN_FIELDS",
    "OUTPUT_TOKEN_FIELDS_OF",
    "SUPPORTED_ENDPOINTS",
    "UTF8_BOM",
    "ErrorCode",
    "InvalidLine",
    "LineSplitter",
    "LineValidator",
    "MediaPart",
    "MediaRules",
    "MediaTally",
    "ShardRange",
    "UnsupportedEndpoint",
    "ValidationLimits",
    "ValidationResult",
    "check_request",
    "content_parts",
    "image_problem",
    "iter_lines",
    "media_problems",
    "normalize_endpoint",
    "structure_problem",
    "validate_stream",
    "with_output_limit",
]
