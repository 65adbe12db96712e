"""A finished batch's output and error files, downloaded next to each other, and its failures
counted by error code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from llmbatch.commands.batches.outcome import summarize_failures
from llmbatch.commands.batches.render import ResultFiles


def download_results(client: openai.OpenAI, batch: Any, directory: Path) -> ResultFiles:
    """Write ``<id>_output.jsonl`` and ``<id>_errors.jsonl`` (those the batch has) into
    ``directory``, streamed, and read the error file back for its failures by code."""
    directory.mkdir(parents=True, exist_ok=True)
    output = _fetch(client, batch.output_file_id, directory / f"{batch.id}_output.jsonl")
    errors = _fetch(client, batch.error_file_id, directory / f"{batch.id}_errors.jsonl")
    failures = []
    if errors is not None:
        with errors.open("rb") as lines:
            failures = summarize_failures(lines)
    return ResultFiles(batch=batch, output_file=output, error_file=errors, failures=failures)


def _fetch(client: openai.OpenAI, file_id: str | None, path: Path) -> Path | None:
    if not file_id:
        return None
    with client.files.with_streaming_response.content(file_id) as response:
        response.stream_to_file(path)
    return path
