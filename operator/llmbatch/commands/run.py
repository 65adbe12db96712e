"""``llmbatch run requests.jsonl``: the executor, locally, on a whole batch input file.

Validates the file first (the same validator as the gateway and operator), runs the shard(s)
with a local filesystem store as work dir (one engine; several shards run concurrently on it),
shows a progress bar, then merges the result chunks into OpenAI-format output and error files.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import orjson

from llmbatch.api.shard import EngineSpec, ModelRef, ShardSpec
from llmbatch.core.validation import (
    UnsupportedEndpoint,
    ValidationLimits,
    ValidationResult,
    normalize_endpoint,
    validate_stream,
)
from llmbatch.executor.engines import EngineConfigError, create_engine
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.executor.main import run_shards
from llmbatch.executor.models import MODELS, ModelNotAvailable, resolve
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import InvalidKey, ObjectStore, validate_key
from llmbatch.storage.shardresults import list_chunks

_CHUNK = 1 << 20


def _chunks(path: Path, hasher: Any = None) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            if hasher is not None:
                hasher.update(chunk)
            yield chunk


def _first_url(path: Path) -> str | None:
    with path.open("rb") as handle:
        for raw in handle:
            if raw.strip():
                try:
                    value = orjson.loads(raw.removeprefix(b"\xef\xbb\xbf"))
                except orjson.JSONDecodeError:
                    return None
                url = value.get("url") if isinstance(value, dict) else None
                return url if isinstance(url, str) else None
    return None


def _parse_engine_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--engine-arg")
        try:
            args[key.strip().replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            args[key.strip().replace("-", "_")] = value
    return args


def _summarise_answer(line: dict[str, Any]) -> str:
    body = (line.get("response") or {}).get("body") or {}
    if "error" in body:
        return f"ERROR {line['response']['status_code']}: {body['error'].get('message')}"
    choices = body.get("choices") or []
    if choices:
        first = choices[0]
        text = (
            (first.get("message") or {}).get("content") if "message" in first else first.get("text")
        )
        return str(text).strip()
    data = body.get("data") or []
    if data:
        return f"{len(data)} embedding(s) of {len(data[0].get('embedding', []))} dims"
    return json.dumps(body)[:200]


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

    # 1. validate, as the gateway would
    url = _first_url(requests) or "/v1/chat/completions"
    endpoint = normalize_endpoint(url) or "/v1/chat/completions"
    hasher = hashlib.sha256()
    limits = ValidationLimits(max_requests=10_000_000, max_bytes=1 << 40)
    try:
        result = validate_stream(
            _chunks(requests, hasher), endpoint=endpoint, limits=limits, shard_requests=1 << 30
        )
    except UnsupportedEndpoint as exc:
        raise click.ClickException(str(exc)) from exc
    if not result.ok:
        for err in result.errors:
            where = f"line {err.line}: " if err.line is not None else ""
            console.print(f"[red]{where}{err.code}: {err.message}")
        raise click.ClickException(f"{result.error_count} invalid lines in {requests}; nothing ran")
    if result.request_count == 0:
        raise click.ClickException(f"{requests} has no requests")
    if shards > 1:
        per_shard = math.ceil(result.request_count / shards)
        result = validate_stream(
            _chunks(requests), endpoint=endpoint, limits=limits, shard_requests=per_shard
        )
    batch_uid = "local-" + hasher.hexdigest()[:32]

    # 2. model and engine
    model_path: Path
    model_args: dict[str, Any] = {}
    if engine == "simulated":
        model_path = Path(model_name)
    else:
        try:
            model_path, model_args = resolve(model_name)
        except ModelNotAvailable as exc:
            raise click.ClickException(str(exc)) from exc
    args = {**model_args, **_parse_engine_args(engine_args)}
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    served = result.model or model_name
    model = ModelRef(name=served, path=str(model_path), aliases=[model_name])

    # 3. stores and specs
    temp_dir = None if work_dir else Path(tempfile.mkdtemp(prefix="llmbatch-run-"))
    work = (work_dir or temp_dir or Path(".")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    store = FilesystemStore(work)
    input_dir, input_key = requests.resolve().parent, requests.name
    try:
        validate_key(input_key)
    except InvalidKey:
        input_key = "input/requests.jsonl"
        if store.head(input_key) is None:
            store.put(input_key, _chunks(requests))
        input_dir = work
    input_store: ObjectStore = store if input_dir == work else FilesystemStore(input_dir)
    specs = [
        ShardSpec(
            batch_id=f"batch_local_{batch_uid[6:18]}",
            batch_uid=batch_uid,
            shard_index=shard.index,
            endpoint=endpoint,  # type: ignore[arg-type]
            store=f"file://{work}",
            input_store=f"file://{input_dir}",
            input_key=input_key,
            start=shard.start,
            end=shard.end,
            first_line=shard.first_line,
            output_prefix=f"{batch_uid}/shards/{shard.index:05d}",
            model=model,
            engine=EngineSpec(name=engine, args=args),  # type: ignore[arg-type]
            flush_lines=flush_lines,
            flush_seconds=5.0,
        )
        for shard in result.shards
    ]

    console.print(
        f"[bold]{result.request_count}[/] requests, endpoint {endpoint}, model {served} → "
        f"{model_name} ({engine}), {len(specs)} shard(s); work dir {work}"
    )
    started = time.monotonic()
    code, runners, engine_seconds = asyncio.run(
        _run(specs, store, input_store, result, console, show_progress=not no_progress)
    )
    elapsed = time.monotonic() - started

    # 4. merge chunks into the OpenAI output and error files
    completed, failed = _merge(store, specs, output, errors)
    out_tokens = sum(r.stats.output_tokens for r in runners)
    in_tokens = sum(r.stats.input_tokens for r in runners)
    run_seconds = max(elapsed - engine_seconds, 1e-9)
    console.print(
        f"completed [green]{completed}[/], failed [red]{failed}[/] of {result.request_count}; "
        f"tokens in {in_tokens} / out {out_tokens}; "
        f"{out_tokens / run_seconds:.1f} output tokens/s over {run_seconds:.1f} s "
        f"(+{engine_seconds:.1f} s engine start)"
    )
    console.print(f"output: {output}\nerrors: {errors}")
    if print_results:
        for path in (output, errors):
            for raw in path.read_bytes().splitlines():
                line = orjson.loads(raw)
                click.echo(f"{line['custom_id']}: {_summarise_answer(line)}")
    if temp_dir is not None and code == ExitCode.DONE:
        shutil.rmtree(temp_dir, ignore_errors=True)
    elif code != ExitCode.DONE:
        console.print(f"[yellow]work dir kept for a resume: --work-dir {work}")
    if code != ExitCode.DONE:
        sys.exit(int(code))


async def _run(
    specs: list[ShardSpec],
    store: ObjectStore,
    input_store: ObjectStore,
    result: ValidationResult,
    console: Any,
    *,
    show_progress: bool,
) -> tuple[ExitCode, list[ShardRunner], float]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    spec = specs[0]
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
    engine_seconds = time.monotonic() - t0
    holder: list[ShardRunner] = []
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not show_progress,
    )
    task = progress.add_task("requests", total=result.request_count, detail="")
    stop = asyncio.Event()

    async def refresh() -> None:
        t_start = time.monotonic()
        while not stop.is_set():
            done = sum(r.stats.completed + r.stats.failed + r.stats.skipped for r in holder)
            out = sum(r.stats.output_tokens for r in holder)
            failed = sum(r.stats.failed for r in holder)
            rate = out / max(time.monotonic() - t_start, 1e-9)
            progress.update(task, completed=done, detail=f"failed {failed}, {rate:.0f} tok/s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    try:
        with progress:
            refresher = asyncio.create_task(refresh())
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
    code = {
        Outcome.DONE: ExitCode.DONE,
        Outcome.PREEMPTED: ExitCode.PREEMPTED,
        Outcome.ENGINE_FAILED: ExitCode.ENGINE_FAILED,
        Outcome.STORE_FAILED: ExitCode.STORE_FAILED,
    }[outcome]
    for runner in runners:
        if runner.message:
            console.print(f"[yellow]shard {runner.spec.shard_index}: {runner.message}")
    return code, runners, engine_seconds


def _merge(
    store: ObjectStore, specs: list[ShardSpec], output: Path, errors: Path
) -> tuple[int, int]:
    counts = {"output": 0, "errors": 0}
    for kind, path in (("output", output), ("errors", errors)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("wb") as handle:
            for spec in specs:
                for key in list_chunks(store, spec.output_prefix, kind):  # type: ignore[arg-type]
                    data = store.get(key)
                    counts[kind] += data.count(b"\n")
                    handle.write(data)
        tmp.replace(path)
    return counts["output"], counts["errors"]
