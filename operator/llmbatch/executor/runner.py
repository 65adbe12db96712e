"""Run one shard: stream its byte range, feed the engine with bounded in-flight work, commit
results as chunks, stop cleanly on request, notice a dead or hung engine."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from llmbatch.api.openai import BatchRequestLine
from llmbatch.api.shard import ShardSpec
from llmbatch.core.ids import batch_request_id, request_id
from llmbatch.core.tiers import TIER_RANK
from llmbatch.core.validation import normalize_endpoint
from llmbatch.executor.engines.base import (
    Engine,
    EngineDead,
    EngineRequest,
    EngineResult,
    error_body,
)
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.shardresults import CommitFailed, ResultLine, ShardResults, result_line
from llmbatch.storage.slotchannel import LeaseFence

log = logging.getLogger("llmbatch.executor")

_UTF8_BOM = b"\xef\xbb\xbf"


class Outcome(enum.Enum):
    DONE = "done"
    PREEMPTED = "preempted"
    ENGINE_FAILED = "engine_failed"
    STORE_FAILED = "store_failed"
    """Results could not be committed within the retry window: the run ends so the Job retries
    and the next run resumes from the committed chunks."""
    LEASE_LOST = "lease_lost"
    """The shard's lease went to another slot (ours lapsed): stop, commit nothing more; the new
    holder resumes from the committed chunks."""


class RunnerCrashed(RuntimeError):
    """A task of the run raised unexpectedly (a bug): the run ends, nothing counts as done."""


@dataclass
class ShardStats:
    """Live counters of one run (committed + pending), for progress bars and logs."""

    completed: int = 0
    failed: int = 0
    skipped: int = 0
    in_flight: int = 0
    read: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class ShardRunner:
    """Executes one :class:`ShardSpec` against an already started engine."""

    def __init__(
        self,
        spec: ShardSpec,
        engine: Engine,
        store: ObjectStore,
        input_store: ObjectStore | None = None,
        *,
        fence: LeaseFence | None = None,
    ) -> None:
        self.spec = spec
        self.fence = fence
        self.engine = engine
        self.store = store
        self.input_store = input_store or store
        self.results = ShardResults(
            store, spec.output_prefix, batch_id=spec.batch_id, shard_index=spec.shard_index
        )
        self.max_in_flight = spec.max_in_flight or 2 * engine.max_num_seqs
        self.stats = ShardStats()
        self.message: str | None = None
        self._stopping = False
        self._engine_failure: str | None = None
        self._store_failure: str | None = None
        self._crash: BaseException | None = None
        self._lease_lost: str | None = None
        self._cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._commit_tasks: set[asyncio.Task[None]] = set()
        self._commit_lock: asyncio.Lock | None = None
        self._last_result = time.monotonic()
        self._last_commit = time.monotonic()

    # --- control ---------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop taking work (SIGTERM). Safe to call from a signal handler in the loop thread."""
        if not self._stopping:
            log.warning("shard %s: stop requested, draining", self.spec.shard_index)
        self._stopping = True
        self._wake()

    def _fail_engine(self, reason: str) -> None:
        if self._engine_failure is None:
            log.error("shard %s: engine failed: %s", self.spec.shard_index, reason)
            self._engine_failure = reason
        self._wake()

    def _wake(self) -> None:
        cond = self._cond
        if cond is None:
            return

        async def notify() -> None:
            async with cond:
                cond.notify_all()

        asyncio.get_running_loop().create_task(notify())

    def _fail_store(self, reason: str) -> None:
        if self._store_failure is None:
            log.error("shard %s: results cannot be committed: %s", self.spec.shard_index, reason)
            self._store_failure = reason
        self._wake()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        """Done callback of every task of the run: an exception is never dropped."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        if self._crash is None:
            log.error("shard %s: task crashed", self.spec.shard_index, exc_info=exc)
            self._crash = exc
        self._wake()

    def _spawn(self, coro: Coroutine[Any, Any, None], into: set[asyncio.Task[None]]) -> None:
        task = asyncio.create_task(coro)
        into.add(task)  # keep a reference until done
        task.add_done_callback(into.discard)
        task.add_done_callback(self._task_done)

    @property
    def _halted(self) -> bool:
        return (
            self._stopping
            or self._engine_failure is not None
            or self._store_failure is not None
            or self._crash is not None
            or self._lease_lost is not None
        )

    # --- main ------------------------------------------------------------------------------------

    async def run(self) -> Outcome:
        self._cond = asyncio.Condition()
        self._commit_lock = asyncio.Lock()
        await asyncio.to_thread(self.results.recover)
        self._sync_stats()
        if await self._fenced_out():
            return self._end_lease_lost()
        await asyncio.to_thread(self.results.write_progress, state="running", done=False)
        background = [
            asyncio.create_task(self._flush_timer()),
            asyncio.create_task(self._watchdog()),
        ]
        try:
            finished_reading = await self._feed()
            await self._drain()
        finally:
            for task in background:
                task.cancel()
            for failed in await asyncio.gather(*background, return_exceptions=True):
                if isinstance(failed, Exception) and self._crash is None:
                    self._crash = failed
        if self._commit_tasks:
            await asyncio.gather(*self._commit_tasks, return_exceptions=True)
        await self._commit()
        if self._crash is not None:
            raise RunnerCrashed(f"{type(self._crash).__name__}: {self._crash}") from self._crash
        if self._lease_lost is not None:
            return self._end_lease_lost()
        if self._store_failure is not None:
            return await self._end_store_failed()
        # A stop request wins over an engine failure that follows it (Ctrl-C reaches the engine
        # core's process group too and kills it: that is not an engine fault).
        if self._stopping:
            outcome, state = Outcome.PREEMPTED, "preempted"
            self.message = "preempted: stopped on request; finished results are committed"
        elif self._engine_failure is not None:
            outcome, state = Outcome.ENGINE_FAILED, "engine_failed"
            self.message = f"engine failed: {self._engine_failure}"
        elif not finished_reading:
            outcome, state = Outcome.PREEMPTED, "preempted"
            self.message = "preempted: stopped before the whole range was read"
        else:
            outcome, state = Outcome.DONE, "done"
            self.message = None
        await asyncio.to_thread(
            self.results.write_progress,
            state=state,
            done=outcome is Outcome.DONE,
            message=self.message,
        )
        self._sync_stats()
        return outcome

    def _end_lease_lost(self) -> Outcome:
        """Another slot holds the shard now: its progress record is the new holder's to write."""
        self.message = f"lease lost: {self._lease_lost}"
        log.warning("shard %s: %s", self.spec.shard_index, self.message)
        return Outcome.LEASE_LOST

    async def _fenced_out(self) -> bool:
        """Check the lease (when the shard runs under one); a lost lease halts the run."""
        if self.fence is None or self._lease_lost is not None:
            return self._lease_lost is not None
        lost = await asyncio.to_thread(self.fence.lost)
        if lost is not None:
            self._lease_lost = lost
            self._wake()
        return lost is not None

    async def _end_store_failed(self) -> Outcome:
        """Never report ``done`` with results uncommitted: say why (best effort, the store is
        failing) and let the Job retry; the next run skips what the chunks hold."""
        self.message = f"store failed: {self._store_failure}"
        try:
            await asyncio.to_thread(
                self.results.write_progress, state="failed", done=False, message=self.message
            )
        except StoreError as exc:
            log.warning("shard %s: progress record not written: %s", self.spec.shard_index, exc)
        return Outcome.STORE_FAILED

    async def _feed(self) -> bool:
        """Read the range and start requests; True when the whole range was read."""
        assert self._cond is not None
        async for line_no, raw in self._lines():
            if self._halted:
                return False
            self.stats.read += 1
            parsed = self._parse(line_no, raw)
            if isinstance(parsed, ResultLine):
                self._record(parsed)
                continue
            if parsed.custom_id in self.results.done_ids:
                self.stats.skipped += 1
                continue
            async with self._cond:
                await self._cond.wait_for(
                    lambda: self.stats.in_flight < self.max_in_flight or self._halted
                )
            if self._halted:
                return False
            if self.results.pending_count >= 2 * self.spec.flush_lines:
                await self._commit()  # backpressure: the store is behind the engine
            if self.stats.in_flight == 0:
                self._last_result = time.monotonic()  # the watchdog times from the first request
            self.stats.in_flight += 1
            self._spawn(self._run_one(parsed), self._tasks)
        return not self._halted

    async def _drain(self) -> None:
        """Wait for in-flight requests: all of them normally, a grace period when stopping."""
        while self._tasks:
            if (
                self._engine_failure is not None
                or self._store_failure is not None
                or self._lease_lost is not None
            ):
                break
            timeout = self.spec.drain_seconds if self._stopping else 1.0
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending and self._stopping:
                log.warning("shard %s: abandoning %d requests", self.spec.shard_index, len(pending))
                break
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- one request -----------------------------------------------------------------------------

    async def _run_one(self, request: EngineRequest) -> None:
        try:
            try:
                result = await self.engine.handle(request)
            except EngineDead as exc:
                self._fail_engine(str(exc) or "engine dead")
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an engine bug for one request: a 500 line, not a crash
                log.exception("request %s raised", request.custom_id)
                dead = self.engine.dead_reason()
                if dead is not None:
                    self._fail_engine(dead)
                    return
                result = EngineResult(
                    500, error_body(f"{type(exc).__name__}: {exc}", status_code=500)
                )
            if result.status_code >= 500:
                dead = self.engine.dead_reason()
                if dead is not None:  # not a real answer: the request never ran
                    self._fail_engine(dead)
                    return
            self._last_result = time.monotonic()
            self._record(self._line(request.custom_id, result))
        finally:
            self.stats.in_flight -= 1
            self._wake()

    def _line(self, custom_id: str, result: EngineResult) -> ResultLine:
        uid = self.spec.batch_uid
        return result_line(
            line_id=batch_request_id(uid, custom_id),
            custom_id=custom_id,
            status_code=result.status_code,
            request_id=request_id(uid, custom_id),
            body=result.body,
        )

    def _record(self, line: ResultLine) -> None:
        self.results.add(line)
        if line.ok:
            self.stats.completed += 1
            self.stats.input_tokens += line.input_tokens
            self.stats.output_tokens += line.output_tokens
            self.stats.total_tokens += line.total_tokens
        else:
            self.stats.failed += 1
        if self.results.pending_count >= self.spec.flush_lines and not self._commit_tasks:
            self._spawn(self._commit(), self._commit_tasks)

    async def _commit(self) -> None:
        """Commit the pending results as chunks; a failed write keeps them pending and is
        retried with backoff for ``store_retry_seconds``, then the run is halted with
        STORE_FAILED (never a dropped result, never ``done`` with results uncommitted).

        Under a lease, each commit first checks that the lease is still ours: once another
        slot holds the shard nothing more is written (the new holder re-runs what is not
        committed)."""
        assert self._commit_lock is not None
        async with self._commit_lock:
            delay = 0.25
            deadline = time.monotonic() + self.spec.store_retry_seconds
            while self.results.pending_count:
                self._last_commit = time.monotonic()
                try:
                    if await self._fenced_out():
                        return
                    await self._commit_once()
                    return
                except CommitFailed as exc:
                    self.results.restore(exc.unwritten)
                    error: Exception = exc
                except StoreError as exc:  # the lease could not be read: retried the same way
                    error = exc
                if self._store_failure is not None or time.monotonic() >= deadline:
                    self._fail_store(str(error.cause if isinstance(error, CommitFailed) else error))
                    return
                log.warning("shard %s: %s; retrying in %.2f s", self.spec.shard_index, error, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _commit_once(self) -> None:
        batch = self.results.take_pending()
        write = asyncio.ensure_future(asyncio.to_thread(self.results.commit, batch))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # A cancelled caller (the flush timer at shutdown) keeps the lock until the thread
            # has written the chunk, so the final commit and the progress record are written
            # strictly after it; lines it could not write go back to the pending ones.
            try:
                await write
            except CommitFailed as exc:
                self.results.restore(exc.unwritten)
            raise

    def _sync_stats(self) -> None:
        p = self.results.progress
        self.stats.completed = p.completed
        self.stats.failed = p.failed
        self.stats.input_tokens = p.input_tokens
        self.stats.output_tokens = p.output_tokens
        self.stats.total_tokens = p.total_tokens

    # --- input -----------------------------------------------------------------------------------

    async def _lines(self) -> AsyncIterator[tuple[int, bytes]]:
        spec = self.spec
        chunks = iter(self.input_store.iter_range(spec.input_key, spec.start, spec.end))
        line_no = spec.first_line
        buffer = b""
        first = spec.start == 0
        while True:
            chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                break
            if first:
                chunk = chunk.removeprefix(_UTF8_BOM)
                first = False
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                if raw.strip():
                    yield line_no, raw
                line_no += 1
        if buffer.strip():
            yield line_no, buffer

    def _parse(self, line_no: int, raw: bytes) -> EngineRequest | ResultLine:
        """An engine request, or the error line of a line that cannot run."""
        custom_id = f"__line_{line_no}"
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._bad(custom_id, f"Line {line_no} is not valid JSON: {exc}", None)
        if isinstance(value, dict) and isinstance(value.get("custom_id"), str):
            custom_id = value["custom_id"]
        try:
            line = BatchRequestLine.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first.get("loc", ())) or None
            return self._bad(custom_id, f"Line {line_no}: {first.get('msg')}", param)
        if normalize_endpoint(line.url) != self.spec.endpoint:
            return self._bad(
                custom_id,
                f"Line {line_no}: url {line.url!r} is not the batch endpoint {self.spec.endpoint}.",
                "url",
            )
        if line.body.get("stream") is True:
            return self._bad(custom_id, f"Line {line_no}: stream is not supported.", "body.stream")
        uid = self.spec.batch_uid
        return EngineRequest(
            custom_id=line.custom_id,
            url=self.spec.endpoint,
            body=line.body,
            request_id=request_id(uid, line.custom_id),
            priority=TIER_RANK[self.spec.tier],
        )

    def _bad(self, custom_id: str, message: str, param: str | None) -> ResultLine:
        body = error_body(message, status_code=400, param=param, code="invalid_request_line")
        return self._line(custom_id, EngineResult(400, body))

    # --- background ------------------------------------------------------------------------------

    async def _flush_timer(self) -> None:
        period = self.spec.flush_seconds
        while True:
            await asyncio.sleep(min(period, 1.0))
            if self.results.pending_count and time.monotonic() - self._last_commit >= period:
                await self._commit()

    async def _watchdog(self) -> None:
        limit = self.spec.watchdog_seconds
        while True:
            await asyncio.sleep(min(limit / 4, 1.0))
            dead = self.engine.dead_reason()
            if dead is not None and self.stats.in_flight:
                self._fail_engine(dead)
            idle = time.monotonic() - self._last_result
            if self.stats.in_flight and idle > limit:
                self._fail_engine(
                    f"engine hung: no result for {idle:.0f} s with "
                    f"{self.stats.in_flight} requests in flight (watchdog {limit:.0f} s)"
                )

    def progress_snapshot(self) -> dict[str, Any]:
        return {
            "completed": self.stats.completed,
            "failed": self.stats.failed,
            "skipped": self.stats.skipped,
            "in_flight": self.stats.in_flight,
        }
