"""The shards of ``llmbatch run`` on one local engine, with a progress bar."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import click

from llmbatch.api.shard import ShardSpec
from llmbatch.core.validation import ValidationResult
from llmbatch.executor.engines import EngineConfigError, create_engine
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.executor.main import run_shards
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.storage.base import ObjectStore

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from llmbatch.executor.engines.base import Engine

_EXIT_CODES = {
    Outcome.DONE: ExitCode.DONE,
    Outcome.PREEMPTED: ExitCode.PREEMPTED,
    Outcome.ENGINE_FAILED: ExitCode.ENGINE_FAILED,
    Outcome.STORE_FAILED: ExitCode.STORE_FAILED,
}


async def run_on_engine(
    specs: list[ShardSpec],
    store: ObjectStore,
    input_store: ObjectStore,
    result: ValidationResult,
    console: Any,
    *,
    show_progress: bool,
) -> tuple[ExitCode, list[ShardRunner], float]:
    """Start the engine, run every shard on it; the exit code, the runners and engine start time."""
    engine, engine_seconds = await _start_engine(specs[0], console)
    holder: list[ShardRunner] = []
    progress, task = _progress_bar(console, result.request_count, show_progress)
    stop = asyncio.Event()
    try:
        with progress:
            refresher = asyncio.create_task(_refresh(progress, task, holder, stop))
            try:
                outcome, runners = await run_shards(
                    specs,
                    engine,
                    [(store, input_store)] * len(specs),
                    on_runners=holder.extend,
                )
            finally:
                stop.set()
                await refresher
    finally:
        await engine.close()
    code = _EXIT_CODES[outcome]
    for runner in runners:
        if runner.message:
            console.print(f"[yellow]shard {runner.spec.shard_index}: {runner.message}")
    return code, runners, engine_seconds


async def _start_engine(spec: ShardSpec, console: Any) -> tuple[Engine, float]:
    """The started engine of ``spec`` and the seconds it took to start."""
    try:
        engine = create_engine(spec.engine, spec.model, spec.served_names())
    except EngineConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    t0 = time.monotonic()
    with console.status(f"starting the {spec.engine.name} engine ({spec.model.path}) ..."):
        try:
            await engine.start()
        except EngineConfigError as exc:
            raise click.ClickException(str(exc)) from exc
    return engine, time.monotonic() - t0


def _progress_bar(console: Any, total: int, show: bool) -> tuple[Progress, TaskID]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show,
    )
    return progress, progress.add_task("requests", total=total, detail="")


async def _refresh(
    progress: Progress, task: TaskID, runners: list[ShardRunner], stop: asyncio.Event
) -> None:
    """Update the bar from the runners' counters four times a second until ``stop``."""
    t_start = time.monotonic()
    while not stop.is_set():
        done = sum(r.stats.completed + r.stats.failed + r.stats.skipped for r in runners)
        out = sum(r.stats.output_tokens for r in runners)
        failed = sum(r.stats.failed for r in runners)
        rate = out / max(time.monotonic() - t_start, 1e-9)
        progress.update(task, completed=done, detail=f"failed {failed}, {rate:.0f} tok/s")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)
