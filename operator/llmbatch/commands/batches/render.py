"""What the client commands print: a table on a terminal, JSON in a pipe (stdout only; progress
and hints go to stderr)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table

from llmbatch.commands.batches.outcome import FailureGroup, Progress
from llmbatch.commands.batches.session import Format, Session


@dataclass
class ResultFiles:
    """Where a finished batch's results went, and its failures by code."""

    batch: Any
    output_file: Path | None
    error_file: Path | None
    failures: list[FailureGroup]

    def as_json(self) -> dict[str, Any]:
        return {
            "batch": as_json(self.batch),
            "output_file": str(self.output_file) if self.output_file else None,
            "error_file": str(self.error_file) if self.error_file else None,
            "failures": [asdict(group) for group in self.failures],
        }


def as_json(batch: Any) -> dict[str, Any]:
    """An SDK object as the API sent it (extra fields included)."""
    data: dict[str, Any] = batch.model_dump(mode="json")
    return data


def print_json(session: Session, value: Any) -> None:
    session.out.file.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
    session.out.file.flush()


def _when(stamp: int | None) -> str:
    if not stamp:
        return ""
    return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def show_batch(session: Session, batch: Any) -> None:
    """One batch: its fields, one per row."""
    if session.output == Format.JSON:
        print_json(session, as_json(batch))
        return
    progress = Progress.of(batch)
    table = Table(show_header=False, box=None, pad_edge=False)
    rows = [
        ("id", batch.id),
        ("status", batch.status),
        ("requests", progress.counts()),
        ("estimate", progress.eta(time.time())),
        ("endpoint", batch.endpoint),
        ("model", batch.model or ""),
        ("created", _when(batch.created_at)),
        ("input file", batch.input_file_id),
        ("output file", batch.output_file_id or ""),
        ("error file", batch.error_file_id or ""),
        ("metadata", ", ".join(f"{k}={v}" for k, v in (batch.metadata or {}).items())),
    ]
    errors = batch.errors.data if batch.errors and batch.errors.data else []
    rows += [
        ("error", f"{e.code}: {e.message}" + (f" (line {e.line})" if e.line else ""))
        for e in errors
    ]
    for name, value in rows:
        if value:
            table.add_row(f"[bold]{name}", str(value))
    session.out.print(table)


def show_batches(session: Session, batches: Sequence[Any]) -> None:
    """A list of batches: id, status, progress, age."""
    if session.output == Format.JSON:
        print_json(session, [as_json(batch) for batch in batches])
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("ID", "STATUS", "DONE", "FAILED", "ENDPOINT", "CREATED"):
        table.add_column(column, no_wrap=True)
    for batch in batches:
        progress = Progress.of(batch)
        counts = f"{progress.done}/{progress.total}" if progress.total is not None else "?"
        table.add_row(
            batch.id,
            batch.status,
            counts,
            str(progress.failed),
            batch.endpoint,
            _when(batch.created_at),
        )
    session.out.print(table)


def show_results(session: Session, results: ResultFiles) -> None:
    """Where the files went and the failures by code."""
    if session.output == Format.JSON:
        print_json(session, results.as_json())
        return
    progress = Progress.of(results.batch)
    session.out.print(f"[bold]{progress.describe(time.time())}")
    if results.output_file:
        session.out.print(f"output: {results.output_file}")
    if results.error_file:
        session.out.print(f"errors: {results.error_file}")
    if not results.failures:
        return
    table = Table(box=None, pad_edge=False, header_style="bold")
    for column in ("CODE", "COUNT", "EXAMPLE"):
        table.add_column(column)
    for group in results.failures:
        example = f"{group.example_custom_id}: {group.example_message}".strip(": ")
        table.add_row(group.code, str(group.count), example)
    session.out.print(table)
