"""``submit``: upload a JSONL file and create a batch from it; with ``--wait``, follow it to the
end and download its results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from llmbatch.commands.batches.render import show_batch
from llmbatch.commands.batches.session import Session, api_errors, session_options
from llmbatch.commands.batches.track import (
    finish,
    interval_option,
    output_dir_option,
    wait_for_end,
)

DEFAULT_ENDPOINT = "/v1/chat/completions"


def endpoint_of(path: Path) -> str:
    """The ``url`` of the file's first request (the endpoint every line must call), else the
    chat endpoint; the gateway checks every line either way."""
    with path.open("rb") as lines:
        for raw in lines:
            if raw.strip():
                try:
                    url = orjson.loads(raw).get("url")
                except (orjson.JSONDecodeError, AttributeError):
                    return DEFAULT_ENDPOINT
                return url if isinstance(url, str) and url else DEFAULT_ENDPOINT
    return DEFAULT_ENDPOINT


def parse_metadata(pairs: tuple[str, ...], priority: str) -> dict[str, str]:
    """``k=v`` pairs as the batch's metadata; flex is asked for as ``tier=flex``."""
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--metadata")
        metadata[key] = value
    if priority == "flex":
        metadata["tier"] = "flex"
    return metadata


@click.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Follow the batch to its end, then download results.")
@click.option(
    "--priority",
    type=click.Choice(["standard", "expedited", "flex"]),
    default="standard",
    show_default=True,
    help="The scheduling tier.",
)
@click.option("--metadata", multiple=True, metavar="KEY=VALUE", help="Metadata (repeatable).")
@click.option("--endpoint", default=None, help="Default: the url of the file's first request.")
@click.option("--completion-window", default="24h", show_default=True)
@click.option(
    "--idempotency-key",
    default=None,
    help="Retry-safe creation: the same key and file return the same batch.",
)
@output_dir_option("With --wait")
@interval_option
@session_options
def submit(
    session: Session,
    file: Path,
    wait: bool,
    priority: str,
    metadata: tuple[str, ...],
    endpoint: str | None,
    completion_window: str,
    idempotency_key: str | None,
    output_dir: Path,
    interval: float,
) -> None:
    """Upload FILE (JSONL, one request per line) and create a batch from it.

    Exit code with --wait: 0 completed, 3 failed, 4 expired, 5 cancelled, 130 interrupted."""
    tags = parse_metadata(metadata, priority)
    extra: dict[str, Any] = {"priority": "expedited"} if priority == "expedited" else {}
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    with api_errors(session):
        with file.open("rb") as source:
            uploaded = session.client.files.create(file=(file.name, source), purpose="batch")
        batch = session.client.batches.create(
            input_file_id=uploaded.id,
            endpoint=endpoint or endpoint_of(file),  # type: ignore[arg-type]
            completion_window=completion_window,  # type: ignore[arg-type]
            metadata=tags or None,
            extra_body=extra or None,
            extra_headers=headers,
        )
    if not wait:
        show_batch(session, batch)
        session.err.print(f"follow it with: llmbatch batches watch {batch.id}", highlight=False)
        return
    finish(session, wait_for_end(session, batch.id, interval), output_dir)
