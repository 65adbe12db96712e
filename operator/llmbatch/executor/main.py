"""``python -m llmbatch.executor --shard-spec SOURCE``: run one shard, exit with a documented code.

See :mod:`llmbatch.executor.exitcodes` for the codes and docs/executor.md for the whole story.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

from pydantic import ValidationError

from llmbatch import logs
from llmbatch.api.shard import ShardSpec
from llmbatch.executor.engines import Engine, EngineConfigError, create_engine
from llmbatch.executor.exitcodes import (
    ExitCode,
    termination_log_path,
    write_termination_message,
)
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.executor.slot import FixedAssignments, Slot, SlotSettings
from llmbatch.executor.spec import load_slot_spec, load_spec
from llmbatch.storage import open_store
from llmbatch.storage.base import InvalidKey, ObjectNotFound, ObjectStore, StoreError

log = logging.getLogger("llmbatch.executor")
SHARD_SPEC_ENV = "LLMBATCH_SHARD_SPEC"
SLOT_SPEC_ENV = "LLMBATCH_SLOT_SPEC"
T = TypeVar("T")
_ENGINE_CLOSE_TIMEOUT = 30.0


class ShardFailure(Exception):
    """Ends the run with ``code`` and ``message`` (the termination message)."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def open_stores(spec: ShardSpec) -> tuple[ObjectStore, ObjectStore]:
    try:
        store = open_store(spec.store)
        input_store = store if spec.input_store is None else open_store(spec.input_store)
    except ValueError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"bad store URI: {exc}") from exc
    return store, input_store


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None], enabled: bool = True) -> Iterator[None]:
    """Call ``stop`` on SIGTERM / SIGINT while the block runs (when ``enabled``)."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if enabled:
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


async def run_shards(
    specs: Sequence[ShardSpec],
    engine: Engine,
    stores: Sequence[tuple[ObjectStore, ObjectStore]],
    *,
    handle_signals: bool = True,
    on_runners: Callable[[list[ShardRunner]], object] | None = None,
) -> tuple[Outcome, list[ShardRunner]]:
    """Run shards concurrently on one started engine (a slot with a fixed list of shards);
    the worst outcome wins."""
    by_key = {
        (spec.batch_uid, spec.shard_index): pair for spec, pair in zip(specs, stores, strict=True)
    }
    slot = Slot(
        engine,
        FixedAssignments(specs),
        lambda spec: by_key[(spec.batch_uid, spec.shard_index)],
        SlotSettings(concurrency=max(1, len(specs))),
        on_runner=None if on_runners is None else lambda runner: on_runners([runner]),
    )
    with stop_on_signals(slot.request_stop, handle_signals):
        outcome = await slot.run()
    return outcome, slot.runners


async def start_engine(engine: Engine, while_loading: Callable[[], Awaitable[None]] | None) -> bool:
    """Load the model; True when SIGTERM arrived meanwhile (stop before taking work).

    ``while_loading`` runs until the engine is up (a slot's "starting" heartbeats).
    """
    early_stop = asyncio.Event()
    side = None if while_loading is None else asyncio.ensure_future(while_loading())
    started = time.monotonic()
    try:
        with stop_on_signals(early_stop.set):
            await engine.start()
    except EngineConfigError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, str(exc)) from exc
    except Exception as exc:
        raise ShardFailure(
            ExitCode.ENGINE_FAILED, f"engine failed to start: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        if side is not None:
            side.cancel()
            await asyncio.gather(side, return_exceptions=True)
    log.info("engine %s ready in %.1f s", engine.name, time.monotonic() - started)
    return early_stop.is_set()


async def close_engine(engine: Engine) -> None:
    try:
        await asyncio.wait_for(engine.close(), _ENGINE_CLOSE_TIMEOUT)
    except Exception:
        log.exception("engine close failed")


def exit_code(outcome: Outcome, message: str | None) -> ExitCode:
    """The process exit of a run's worst outcome (raises ShardFailure for a failure)."""
    failures = {
        Outcome.ENGINE_FAILED: ExitCode.ENGINE_FAILED,
        Outcome.STORE_FAILED: ExitCode.STORE_FAILED,
        Outcome.PREEMPTED: ExitCode.PREEMPTED,
    }
    if outcome in failures:
        raise ShardFailure(failures[outcome], message or outcome.value.replace("_", " "))
    return ExitCode.DONE


async def _execute(spec: ShardSpec) -> ExitCode:
    stores = open_stores(spec)
    if stores[1].head(spec.input_key) is None:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"input object not found: {spec.input_key}")
    try:
        engine = create_engine(spec.engine, spec.model, spec.served_names())
    except EngineConfigError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, str(exc)) from exc
    try:
        if await start_engine(engine, None):
            raise ShardFailure(ExitCode.PREEMPTED, "preempted before any work started")
        outcome, runners = await run_shards([spec], engine, [stores])
    finally:
        await close_engine(engine)
    runner = runners[0] if runners else None
    return exit_code(outcome, runner.message if runner is not None else None)


def _load(load: Callable[[str], T], source: str, what: str) -> T:
    """A spec, or the ShardFailure that says why it cannot be used."""
    try:
        return load(source)
    except (ObjectNotFound, InvalidKey) as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"bad {what}: {exc}") from exc
    except StoreError as exc:
        # The store is unreachable or failing: the Job retries (never a FailJob exit).
        raise ShardFailure(ExitCode.STORE_FAILED, f"{what} unreadable: {exc}") from exc
    except (ValueError, ValidationError, OSError) as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"bad {what}: {exc}") from exc


def _run(args: argparse.Namespace) -> ExitCode:
    if args.slot:
        from llmbatch.executor.slotprocess import execute_slot

        slot_spec = _load(load_slot_spec, args.slot, "slot spec")
        logs.bind_context(slot=slot_spec.slot)
        return asyncio.run(execute_slot(slot_spec))
    if not args.shard_spec:
        raise ShardFailure(ExitCode.BAD_CONFIG, "no shard spec (--shard-spec) or slot (--slot)")
    spec = _load(load_spec, args.shard_spec, "shard spec")
    logs.bind_context(batch_id=spec.batch_id, shard=spec.shard_index)
    return asyncio.run(_execute(spec))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch.executor",
        description="Run one shard of a batch, or a warm slot that runs the shards it is assigned.",
    )
    parser.add_argument(
        "--shard-spec",
        default=os.environ.get(SHARD_SPEC_ENV),
        help="JSON file, inline JSON, '-' (stdin) or '<store-uri>#<key>' "
        f"(default: ${SHARD_SPEC_ENV})",
    )
    parser.add_argument(
        "--slot",
        default=os.environ.get(SLOT_SPEC_ENV),
        help="Run as a warm slot: its SlotSpec, from the same kinds of source "
        f"(default: ${SLOT_SPEC_ENV})",
    )
    parser.add_argument(
        "--termination-log",
        default=None,
        help="Where the failure reason is written (default: $LLMBATCH_TERMINATION_LOG, "
        "else /dev/termination-log)",
    )
    parser.add_argument("--log-level", default=os.environ.get("LLMBATCH_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    logs.configure(args.log_level, stream=sys.stderr)
    termination_log = termination_log_path(args.termination_log)
    code: ExitCode
    message: str | None = None
    try:
        code = _run(args)
    except ShardFailure as exc:
        code, message = exc.code, exc.message
    except StoreError as exc:
        code, message = ExitCode.STORE_FAILED, f"object store failed: {exc}"
    except Exception as exc:
        log.exception("executor crashed")
        code, message = ExitCode.UNEXPECTED, f"executor crashed: {type(exc).__name__}: {exc}"
    if message is not None:
        log.error("exit %d (%s): %s", int(code), code.name, message)
        write_termination_message(termination_log, f"{code.name}: {message}")
    return int(code)
