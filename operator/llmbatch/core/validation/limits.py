"""The endpoints a batch may call and the limits a file is validated against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmbatch.api.openai import ENDPOINTS, GENERATE_ENDPOINTS
from llmbatch.core.validation.media import MediaRules

SUPPORTED_ENDPOINTS: tuple[str, ...] = ENDPOINTS
"""The endpoints a batch may call: ``llmbatch.api.openai.ENDPOINTS``."""
OUTPUT_TOKEN_FIELDS: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
OUTPUT_TOKEN_FIELDS_OF: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": OUTPUT_TOKEN_FIELDS,
    "/v1/completions": ("max_tokens",),
    "/v1/responses": ("max_output_tokens",),
}
"""The body fields that bound a request's output tokens, per endpoint (completions has no
max_completion_tokens: vLLM would ignore it and stop at its own 16-token default)."""
GENERATIVE_ENDPOINTS = frozenset(GENERATE_ENDPOINTS)
"""Endpoints whose requests generate tokens, so an output-token limit means something (each has
its fields in :data:`OUTPUT_TOKEN_FIELDS_OF`)."""


def with_output_limit(body: dict[str, Any], endpoint: str, limit: int | None) -> dict[str, Any]:
    """``body`` bounded at ``limit`` output tokens when it sets no limit of its endpoint's own
    (the first of :data:`OUTPUT_TOKEN_FIELDS_OF`); as it is otherwise, or without a limit."""
    fields = OUTPUT_TOKEN_FIELDS_OF.get(endpoint)
    if limit is None or not fields or any(body.get(f) is not None for f in fields):
        return body
    return {**body, fields[0]: limit}


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
    media: MediaRules = field(default_factory=MediaRules)
    """The image and audio parts the model and the platform accept (``media``)."""
