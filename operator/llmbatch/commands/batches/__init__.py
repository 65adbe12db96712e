"""``llmbatch batches``: submit JSONL files and follow, fetch and cancel batches through the
gateway, on the official OpenAI SDK (the ``[client]`` extra), configured like the SDK by
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` (docs/cli.md)."""

from __future__ import annotations

import click

from llmbatch.commands.batches.inspect import cancel, get, list_batches
from llmbatch.commands.batches.submit import submit
from llmbatch.commands.batches.track import results, watch


@click.group()
def batches() -> None:
    """Submit and follow batches through the gateway (OPENAI_BASE_URL, OPENAI_API_KEY).

    Exit codes: 0 completed (or done), 1 error, 2 bad arguments, 3 the batch failed,
    4 it expired, 5 it was cancelled, 130 interrupted while waiting (the batch keeps running)."""


for _command in (submit, list_batches, get, watch, results, cancel):
    batches.add_command(_command)
