"""``llmbatch validate FILE``: check a batch input file the way the gateway and operator do."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click
import orjson

from llmbatch.core.validation import (
    SUPPORTED_ENDPOINTS,
    UnsupportedEndpoint,
    ValidationLimits,
    validate_stream,
)

_CHUNK = 1 << 20


def _read_chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--endpoint",
    default="/v1/chat/completions",
    show_default=True,
    help=f"Batch endpoint; one of {', '.join(SUPPORTED_ENDPOINTS)} (or /openai/v1/...).",
)
@click.option("--max-requests", type=click.IntRange(min=1), default=50_000, show_default=True)
@click.option("--max-bytes", type=click.IntRange(min=1), default=200_000_000, show_default=True)
@click.option(
    "--max-line-bytes", type=click.IntRange(min=1), default=8 * 1024 * 1024, show_default=True
)
@click.option(
    "--require-output-token-limit",
    is_flag=True,
    help="Every chat/completions line must set max_tokens or max_completion_tokens.",
)
@click.option("--max-errors", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--shard-requests", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the OpenAI `errors` object as JSON.")
def validate(
    file: Path,
    endpoint: str,
    max_requests: int,
    max_bytes: int,
    max_line_bytes: int,
    require_output_token_limit: bool,
    max_errors: int,
    shard_requests: int,
    as_json: bool,
) -> None:
    """Validate a batch input FILE (JSONL); exit 1 when any line is invalid."""
    limits = ValidationLimits(
        max_requests=max_requests,
        max_bytes=max_bytes,
        max_line_bytes=max_line_bytes,
        require_output_token_limit=require_output_token_limit,
        max_errors=max_errors,
    )
    try:
        result = validate_stream(
            _read_chunks(file), endpoint=endpoint, limits=limits, shard_requests=shard_requests
        )
    except UnsupportedEndpoint as exc:
        raise click.BadParameter(str(exc), param_hint="--endpoint") from exc
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(result.errors_object(), option=orjson.OPT_INDENT_2))
        sys.stdout.write("\n")
    elif result.ok:
        click.echo(
            f"OK: {result.request_count} requests, model {result.model}, "
            f"{result.total_bytes} bytes, {len(result.shards)} shards of ≤{shard_requests}"
        )
    else:
        for error in result.errors:
            where = f"line {error.line}: " if error.line is not None else ""
            click.echo(f"{where}{error.code}: {error.message}", err=True)
        hidden = result.error_count - len(result.errors)
        if hidden:
            click.echo(f"... and {hidden} more errors", err=True)
        click.echo(f"INVALID: {result.error_count} errors in {file}", err=True)
    if not result.ok:
        sys.exit(1)
