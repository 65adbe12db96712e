"""The input file of ``llmbatch run``: validated as the gateway would, and its content hash."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson

from llmbatch.core.validation import (
    UnsupportedEndpoint,
    ValidationLimits,
    ValidationResult,
    normalize_endpoint,
    validate_stream,
)

_CHUNK = 1 << 20


def file_chunks(path: Path, hasher: Any = None) -> Iterator[bytes]:
    """The file's bytes in 1 MiB chunks, fed to ``hasher`` on the way when given."""
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            if hasher is not None:
                hasher.update(chunk)
            yield chunk


def first_url(path: Path) -> str | None:
    """The ``url`` of the first non-blank line, which names the batch's endpoint."""
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                try:
                    value = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf"))
                except orjson.JSONDecodeError:
                    return None
                url = value.get("url") if isinstance(value, dict) else None
                return url if isinstance(url, str) else None
    return None


@dataclass(frozen=True)
class ValidatedInput:
    """A valid input file: the validator's verdict and shard plan, its endpoint and batch uid."""

    result: ValidationResult
    endpoint: str
    batch_uid: str
    """``local-`` and the file's sha256, so a rerun of the same file resumes the same batch."""


def validate_input(requests: Path, shards: int, console: Any) -> ValidatedInput:
    """Validate ``requests`` and plan ``shards`` shards; a ClickException when nothing can run."""
    url = first_url(requests) or "/v1/chat/completions"
    endpoint = normalize_endpoint(url) or "/v1/chat/completions"
    hasher = hashlib.sha256()
    limits = ValidationLimits(max_requests=10_000_000, max_bytes=1 << 40)
    try:
        result = validate_stream(
            file_chunks(requests, hasher), endpoint=endpoint, limits=limits, shard_requests=1 << 30
        )
    except UnsupportedEndpoint as exc:
        raise click.ClickException(str(exc)) from exc
    if not result.ok:
        for err in result.errors:
            where = f"line {err.line}: " if err.line is not None else ""
            console.print(f"[red]{where}{err.code}: {err.message}")
        raise click.ClickException(f"{result.error_count} invalid lines in {requests}; nothing ran")
    if result.request_count == 0:
        raise click.ClickException(f"{requests} has no requests")
    if shards > 1:
        per_shard = math.ceil(result.request_count / shards)
        result = validate_stream(
            file_chunks(requests), endpoint=endpoint, limits=limits, shard_requests=per_shard
        )
    return ValidatedInput(result, endpoint, "local-" + hasher.hexdigest()[:32])
