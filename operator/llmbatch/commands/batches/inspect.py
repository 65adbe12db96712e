"""``list``, ``get`` and ``cancel``: read or change a batch and print it."""

from __future__ import annotations

import itertools

import click

from llmbatch.commands.batches.render import show_batch, show_batches
from llmbatch.commands.batches.session import Session, api_errors, batch_id, session_options
from llmbatch.commands.batches.track import batch_argument


@click.command("list")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="How many batches, newest first.",
)
@click.option("--all", "everything", is_flag=True, help="Every batch (pages through the list).")
@session_options
def list_batches(session: Session, limit: int, everything: bool) -> None:
    """List the key's batches, newest first."""
    with api_errors(session):
        page = session.client.batches.list(limit=min(limit, 100))
        found = list(page) if everything else list(itertools.islice(page, limit))
    show_batches(session, found)


@click.command("get")
@batch_argument
@session_options
def get(session: Session, batch: str) -> None:
    """Show one batch (an id batch_…, or a Batch object's name batch-…)."""
    with api_errors(session):
        show_batch(session, session.client.batches.retrieve(batch_id(batch)))


@click.command("cancel")
@batch_argument
@session_options
def cancel(session: Session, batch: str) -> None:
    """Cancel a batch: running requests finish, the others end as batch_cancelled lines."""
    with api_errors(session):
        show_batch(session, session.client.batches.cancel(batch_id(batch)))
