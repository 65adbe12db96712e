"""``python -m llmbatch.executor --shard-spec SOURCE``: run one shard, exit with a documented code.

See :mod:`llmbatch.executor.exitcodes` for the codes and docs/executor.md for the whole story.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

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
from llmbatch.executor.spec import load_spec
from llmbatch.storage import open_store
from llmbatch.storage.base import InvalidKey, ObjectNotFound, ObjectStore, StoreError

log = logging.getLogger("llmbatch.executor")
SHARD_SPEC_ENV = "LLMBATCH_SHARD_SPEC"
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


async def run_shards(
    specs: Sequence[ShardSpec],
    engine: Engine,
    stores: Sequence[tuple[ObjectStore, ObjectStore]],
    *,
    handle_signals: bool = True,
    on_runners: object = None,
) -> tuple[Outcome, list[ShardRunner]]:
    """Run shards concurrently on one started engine; the worst outcome wins."""
    runners = [
        ShardRunner(spec, engine, store, input_store)
        for spec, (store, input_store) in zip(specs, stores, strict=True)
    ]
    if callable(on_runners):
        on_runners(runners)
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if handle_signals:

        def stop() -> None:
            for runner in runners:
                runner.request_stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, stop)
                installed.append(sig)
            except (NotImplementedError, RuntimeError):
                pass
    try:
        outcomes = await asyncio.gather(*(runner.run() for runner in runners))
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    for worst in (Outcome.ENGINE_FAILED, Outcome.STORE_FAILED, Outcome.PREEMPTED):
        if worst in outcomes:
            return worst, runners
    return Outcome.DONE, runners


async def _execute(spec: ShardSpec) -> ExitCode:
    stores = open_stores(spec)
    if stores[1].head(spec.input_key) is None:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"input object not found: {spec.input_key}")
    try:
        engine = create_engine(spec.engine, spec.model, spec.served_names())
    except EngineConfigError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, str(exc)) from exc

    # SIGTERM while the model loads: finish loading, then stop before taking work.
    early_stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, early_stop.set)
    started = time.monotonic()
    try:
        await engine.start()
    except EngineConfigError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, str(exc)) from exc
    except Exception as exc:
        raise ShardFailure(
            ExitCode.ENGINE_FAILED, f"engine failed to start: {type(exc).__name__}: {exc}"
        ) from exc
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("engine %s ready in %.1f s", engine.name, time.monotonic() - started)
    try:
        if early_stop.is_set():
            raise ShardFailure(ExitCode.PREEMPTED, "preempted before any work started")
        outcome, runners = await run_shards([spec], engine, [stores])
    finally:
        try:
            await asyncio.wait_for(engine.close(), _ENGINE_CLOSE_TIMEOUT)
        except Exception:
            log.exception("engine close failed")
    runner = runners[0]
    s = runner.stats
    log.info(
        "shard %s %s: completed=%d failed=%d skipped=%d output_tokens=%d",
        spec.shard_index,
        outcome.value,
        s.completed,
        s.failed,
        s.skipped,
        s.output_tokens,
    )
    if outcome is Outcome.ENGINE_FAILED:
        raise ShardFailure(ExitCode.ENGINE_FAILED, runner.message or "engine failed")
    if outcome is Outcome.STORE_FAILED:
        raise ShardFailure(ExitCode.STORE_FAILED, runner.message or "store failed")
    if outcome is Outcome.PREEMPTED:
        raise ShardFailure(ExitCode.PREEMPTED, runner.message or "preempted")
    return ExitCode.DONE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmbatch.executor", description="Run one shard of a batch."
    )
    parser.add_argument(
        "--shard-spec",
        default=os.environ.get(SHARD_SPEC_ENV),
        help="JSON file, inline JSON, '-' (stdin) or '<store-uri>#<key>' "
        f"(default: ${SHARD_SPEC_ENV})",
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
        if not args.shard_spec:
            raise ShardFailure(ExitCode.BAD_CONFIG, "no shard spec (--shard-spec)")
        try:
            spec = load_spec(args.shard_spec)
            logs.bind_context(batch_id=spec.batch_id, shard=spec.shard_index)
        except (ObjectNotFound, InvalidKey) as exc:
            raise ShardFailure(ExitCode.BAD_CONFIG, f"bad shard spec: {exc}") from exc
        except StoreError as exc:
            # The store is unreachable or failing: the Job retries (never a FailJob exit).
            raise ShardFailure(ExitCode.STORE_FAILED, f"shard spec unreadable: {exc}") from exc
        except (ValueError, ValidationError, OSError) as exc:
            raise ShardFailure(ExitCode.BAD_CONFIG, f"bad shard spec: {exc}") from exc
        code = asyncio.run(_execute(spec))
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
