"""``llmbatch run requests.jsonl``: the executor, locally, on a whole batch input file.

Validates the file first (the same validator as the gateway and operator), runs the shard(s)
with a local filesystem store as work dir (one engine; several shards run concurrently on it),
shows a progress bar, then merges the result chunks into OpenAI-format output and error files.
The steps live in :mod:`llmbatch.commands.localrun`.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import time
from pathlib import Path

import click

from llmbatch.commands.localrun.engine import run_on_engine
from llmbatch.commands.localrun.inputfile import validate_input
from llmbatch.commands.localrun.results import echo_answers, merge_results, print_summary
from llmbatch.commands.localrun.shards import choose_engine, open_work_area, shard_specs
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.executor.models import MODELS


@click.command()
@click.argument("requests", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Output file (successes). Default: <requests>.output.jsonl",
)
@click.option(
    "-e",
    "--errors",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Error file (failed requests). Default: <requests>.errors.jsonl",
)
@click.option(
    "--model",
    "model_name",
    default="smollm2",
    show_default=True,
    help=f"One of {', '.join(MODELS)}, or a local HF model folder.",
)
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Split the file into N shards run concurrently on one engine.",
)
@click.option(
    "--engine",
    type=click.Choice(["vllm", "simulated"]),
    default="vllm",
    show_default=True,
    help="`simulated` is for control-plane load tests only.",
)
@click.option(
    "--engine-arg",
    "engine_args",
    multiple=True,
    metavar="KEY=VALUE",
    help="Engine argument (vLLM's Python name; VALUE parsed as JSON when it can be).",
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(min=1),
    default=None,
    help="Requests the engine runs at once (vLLM max_num_seqs).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep chunks here (a rerun with the same dir resumes). Default: a temp dir.",
)
@click.option("--flush-lines", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--print-results", is_flag=True, help="Print each custom_id with its answer.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def run(
    requests: Path,
    output: Path | None,
    errors: Path | None,
    model_name: str,
    shards: int,
    engine: str,
    engine_args: tuple[str, ...],
    max_num_seqs: int | None,
    work_dir: Path | None,
    flush_lines: int,
    print_results: bool,
    no_progress: bool,
) -> None:
    """Run a batch input file (JSONL) locally; write OpenAI-format output and error files."""
    from rich.console import Console

    console = Console(stderr=True)
    output = output or requests.with_suffix(".output.jsonl")
    errors = errors or requests.with_suffix(".errors.jsonl")

    checked = validate_input(requests, shards, console)  # as the gateway would
    result = checked.result
    choice = choose_engine(engine, model_name, engine_args, max_num_seqs, result.model)
    area = open_work_area(work_dir, requests)
    specs = shard_specs(checked, area, choice, flush_lines)

    console.print(
        f"[bold]{result.request_count}[/] requests, endpoint {checked.endpoint}, model "
        f"{choice.model.name} → {model_name} ({engine}), {len(specs)} shard(s); "
        f"work dir {area.work}"
    )
    started = time.monotonic()
    code, runners, engine_seconds = asyncio.run(
        run_on_engine(
            specs, area.store, area.input_store, result, console, show_progress=not no_progress
        )
    )
    elapsed = time.monotonic() - started

    counts = merge_results(area.store, specs, output, errors)
    print_summary(console, counts, result.request_count, runners, elapsed, engine_seconds)
    console.print(f"output: {output}\nerrors: {errors}")
    if print_results:
        echo_answers(output, errors)
    if area.temp_dir is not None and code == ExitCode.DONE:
        shutil.rmtree(area.temp_dir, ignore_errors=True)
    elif code != ExitCode.DONE:
        console.print(f"[yellow]work dir kept for a resume: --work-dir {area.work}")
    if code != ExitCode.DONE:
        sys.exit(int(code))
