"""Following a batch until it ends: a live progress bar on a terminal, a line per change
elsewhere. Both read the batch every ``interval`` seconds; Ctrl-C stops the watching, never the
batch (the caller says how to resume)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.text import Text

from llmbatch.commands.batches import outcome

Fetch = Callable[[], Any]
"""Reads the batch once (an SDK ``Batch``)."""


class _Elapsed(ProgressColumn):
    """Time since the batch was created (not since this command started), ticking live."""

    def render(self, task: Task) -> Text:
        created = task.fields.get("created_at")
        if not created:
            return Text("")
        elapsed = outcome.duration(time.time() - created)
        return Text(f"{elapsed} elapsed", style="progress.elapsed")


def follow(fetch: Fetch, console: Console, interval: float) -> Any:
    """Read the batch until it ends and return it, showing its progress on ``console``."""
    if console.is_terminal:
        return _follow_live(fetch, console, interval)
    return _follow_lines(fetch, console, interval)


def _follow_lines(fetch: Fetch, console: Console, interval: float) -> Any:
    last: list[str] = []
    while True:
        batch = fetch()
        state = outcome.Progress.of(batch)
        line = state.describe(time.time())
        # a new line when something but the clock moved
        key = line.split(", ")[:2]
        if key != last:
            console.print(line, highlight=False)
            last = key
        if state.finished:
            return batch
        time.sleep(interval)


def _follow_live(fetch: Fetch, console: Console, interval: float) -> Any:
    columns = (
        TextColumn("[bold]{task.fields[batch_id]}"),
        TextColumn("{task.fields[status]}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        _Elapsed(),
        TextColumn("{task.fields[eta]}"),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("", total=None, batch_id="", status="", counts="", eta="")
        while True:
            batch = fetch()
            state = outcome.Progress.of(batch)
            bar.update(
                task,
                total=state.total,
                completed=state.done,
                batch_id=state.batch_id,
                status=state.status,
                counts=state.counts(),
                eta=state.eta(time.time()),
                created_at=state.created_at,
            )
            if state.finished:
                if state.total is None:  # ended before its total was known: a full bar
                    bar.update(task, total=1, completed=1)
                return batch
            time.sleep(interval)
