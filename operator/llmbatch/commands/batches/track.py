"""``watch`` and ``results``, and the waiting and finishing that ``submit --wait`` shares."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click
from click.shell_completion import CompletionItem

from llmbatch.commands.batches.download import download_results
from llmbatch.commands.batches.follow import follow
from llmbatch.commands.batches.outcome import TERMINAL, ExitCode, exit_code
from llmbatch.commands.batches.render import show_results
from llmbatch.commands.batches.session import (
    CommandError,
    Session,
    api_errors,
    batch_id,
    not_found_hint,
    session_options,
)

DEFAULT_INTERVAL = 2.0


def complete_batch_ids(ctx: click.Context, _: click.Parameter, prefix: str) -> list[CompletionItem]:
    """Shell completion of a batch id: the newest batches the key can see (none on any error:
    completion never breaks the shell)."""
    import openai

    try:
        client = openai.OpenAI(
            base_url=ctx.params.get("base_url"),
            api_key=ctx.params.get("api_key"),
            max_retries=0,
            timeout=3,
        )
        page = client.batches.list(limit=50)
    except Exception:
        return []
    return [CompletionItem(b.id, help=b.status) for b in page.data if b.id.startswith(prefix)]


batch_argument = click.argument("batch", metavar="ID", shell_complete=complete_batch_ids)


def output_dir_option(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--output-dir``: where the output and error files go (``what`` says when)."""
    return click.option(
        "--output-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("."),
        show_default=True,
        help=f"{what}: where <id>_output.jsonl and <id>_errors.jsonl go.",
    )


interval_option = click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=DEFAULT_INTERVAL,
    show_default=True,
    help="Seconds between two reads of the batch.",
)


def wait_for_end(session: Session, ident: str, interval: float) -> Any:
    """Follow the batch until it ends; Ctrl-C leaves it running and says how to resume."""

    def fetch() -> Any:
        with api_errors(session):
            return session.client.batches.retrieve(ident)

    try:
        return follow(fetch, session.err, interval)
    except KeyboardInterrupt:
        session.err.print(
            f"\nStopped watching; {ident} keeps running. Resume with:\n"
            f"  llmbatch batches watch {ident}",
            highlight=False,
        )
        sys.exit(ExitCode.INTERRUPTED)


def finish(session: Session, batch: Any, output_dir: Path) -> NoReturn:
    """Download the results of an ended batch, print them, exit with the batch's code."""
    with api_errors(session):
        results = download_results(session.client, batch, output_dir)
    show_results(session, results)
    sys.exit(exit_code(batch.status))


@click.command("watch")
@batch_argument
@interval_option
@session_options
def watch(session: Session, batch: str, interval: float) -> None:
    """Follow a batch until it ends, with a live progress bar; exit with its status's code."""
    ended = wait_for_end(session, batch_id(batch), interval)
    session.err.print(f"{ended.id} {ended.status}", highlight=False)
    sys.exit(exit_code(ended.status))


@click.command("results")
@batch_argument
@output_dir_option("The directory")
@click.option(
    "-n",
    "--namespace",
    default=None,
    help="The namespace of a Batch named as kubectl names it (batch-…): the key's tenant.",
)
@session_options
def results(session: Session, batch: str, output_dir: Path, namespace: str | None) -> None:
    """Download a finished batch's output and error files; count its failures by error code.

    ID is the batch's id (batch_…) or its Kubernetes object name (batch-…)."""
    ident = batch_id(batch)
    with api_errors(session, not_found_hint(batch, namespace)):
        found = session.client.batches.retrieve(ident)
    if found.status not in TERMINAL:
        raise CommandError(
            f"{ident} is {found.status}; follow it with: llmbatch batches watch {ident}"
        )
    finish(session, found, output_dir)
