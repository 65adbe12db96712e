"""What ``llmbatch run`` runs: the engine and model, the local work area and the shard specs."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from llmbatch.api.resources import PoolRetries
from llmbatch.api.shard import EngineSpec, ModelRef, RequestRetries, ShardSpec
from llmbatch.commands.localrun.inputfile import ValidatedInput, file_chunks
from llmbatch.executor.models import ModelNotAvailable, resolve
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import InvalidKey, ObjectStore, validate_key


def parse_engine_args(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``--engine-arg KEY=VALUE`` pairs; VALUE parsed as JSON when it can be."""
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


@dataclass(frozen=True)
class EngineChoice:
    """The engine to start, its arguments and the model it serves."""

    name: str
    args: dict[str, Any]
    model: ModelRef


def choose_engine(
    engine: str,
    model_name: str,
    engine_args: tuple[str, ...],
    max_num_seqs: int | None,
    input_model: str | None,
) -> EngineChoice:
    """Resolve ``model_name`` (a catalog name or a folder) and merge the engine arguments.

    The model is served under the name the input uses, with ``model_name`` as an alias.
    """
    model_path: Path
    model_args: dict[str, Any] = {}
    if engine == "simulated":
        model_path = Path(model_name)
    else:
        try:
            model_path, model_args = resolve(model_name)
        except ModelNotAvailable as exc:
            raise click.ClickException(str(exc)) from exc
    args = {**model_args, **parse_engine_args(engine_args)}
    if max_num_seqs is not None:
        args["max_num_seqs"] = max_num_seqs
    served = input_model or model_name
    model = ModelRef(name=served, path=str(model_path), aliases=[model_name])
    return EngineChoice(engine, args, model)


@dataclass(frozen=True)
class WorkArea:
    """The local store the shards write their chunks to, and the store they read the input from."""

    work: Path
    temp_dir: Path | None
    """The work dir when it is a temporary one (removed after a complete run)."""
    store: ObjectStore
    input_store: ObjectStore
    input_dir: Path
    input_key: str


def open_work_area(work_dir: Path | None, requests: Path) -> WorkArea:
    """Use ``work_dir`` (or a temporary dir); the input is read in place when its name is a
    valid store key, else copied into the work dir once."""
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
            store.put(input_key, file_chunks(requests))
        input_dir = work
    input_store: ObjectStore = store if input_dir == work else FilesystemStore(input_dir)
    return WorkArea(work, temp_dir, store, input_store, input_dir, input_key)


def shard_specs(
    checked: ValidatedInput, area: WorkArea, engine: EngineChoice, flush_lines: int
) -> list[ShardSpec]:
    """One spec per planned shard, as the operator would write them."""
    batch_uid = checked.batch_uid
    return [
        ShardSpec(
            batch_id=f"batch_local_{batch_uid[6:18]}",
            batch_uid=batch_uid,
            shard_index=shard.index,
            endpoint=checked.endpoint,  # type: ignore[arg-type]
            store=f"file://{area.work}",
            input_store=f"file://{area.input_dir}",
            input_key=area.input_key,
            start=shard.start,
            end=shard.end,
            first_line=shard.first_line,
            output_prefix=f"{batch_uid}/shards/{shard.index:05d}",
            model=engine.model,
            engine=EngineSpec(name=engine.name, args=engine.args),  # type: ignore[arg-type]
            flush_lines=flush_lines,
            flush_seconds=5.0,
            retries=RequestRetries(max_attempts=PoolRetries().max_attempts),
        )
        for shard in checked.result.shards
    ]
