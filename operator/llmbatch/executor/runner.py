"""Run one shard: stream its byte range, feed the engine with bounded in-flight work, retry
transient engine errors per request, commit results as chunks, stop cleanly on request (a
cancelled batch's requests in the engine finish first), notice a dead or hung engine."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from llmbatch.api.shard import ShardSpec
from llmbatch.core import keys
from llmbatch.core.ids import batch_request_id, request_id
from llmbatch.core.oomblame import blame_message
from llmbatch.core.retries import (
    RetryPolicy,
    error_code,
    is_transient,
    retry_after,
    with_attempts,
)
from llmbatch.executor.engines.base import (
    Engine,
    EngineDead,
    EngineRequest,
    EngineResult,
    error_body,
)
from llmbatch.executor.shardinput import BadLine, parse_line, range_lines
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.shardresults import (
    CommitFailed,
    Fence,
    Fenced,
    ResultLine,
    ShardResults,
    result_line,
)

log = logging.getLogger("llmbatch.executor")
T = TypeVar("T")

#: A request that was in the engine at this many of its crashes (the last time alone) is not
#: sent again: it becomes an error line, and the rest of its shard runs.
CRASHES_TO_GIVE_UP = 2
#: A cancel's long drain checks this often that its cancel mark is still there: a Batch deleted
#: meanwhile takes its work area with it, and its requests are not worth finishing.
CANCEL_MARK_RECHECK_SECONDS = 5.0


class Outcome(enum.Enum):
    DONE = "done"
    PREEMPTED = "preempted"
    ENGINE_FAILED = "engine_failed"
    STORE_FAILED = "store_failed"
    """The store failed this run for longer than its retry window (its input, its results or
    its lease): the run ends, its shard goes back to the queue, and the next run resumes from
    the committed chunks. The slot and its other runs go on."""
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
        fence: Fence | None = None,
        generation: int = 0,
        in_engine: Callable[[], set[str]] | None = None,
    ) -> None:
        self.spec = spec
        self.engine = engine
        self.store = store
        self.input_store = input_store or store
        self.results = ShardResults(
            store,
            spec.output_prefix,
            batch_id=spec.batch_id,
            shard_index=spec.shard_index,
            fence=fence,
            generation=generation,
        )
        self._in_flight: set[str] = set()
        #: The custom_ids of this run inside the engine now (past any gate of the slot's).
        self.in_engine = in_engine or (lambda: set(self._in_flight))
        self.counts_attempt = True
        """Whether this run's failure is the shard's doing (see ``ShardReport.counts_attempt``)."""
        self.crash_suspects = 0
        """Requests of this run the engine crash was laid at."""
        self._crash_suspects: set[str] | None = None
        self.max_in_flight = spec.max_in_flight or 2 * engine.max_num_seqs
        self.stats = ShardStats()
        self.message: str | None = None
        self._stopping = False
        self._hard_stop_until: float | None = None
        """Set by a stop that is not a take-back (SIGTERM): the drain ends by then whatever."""
        self._cancel_drain: bool | None = None
        """Whether the stopping run drains for a cancel (None: its drain has not decided): a
        cancelled batch's running requests finish, a request between two attempts included."""
        self._engine_failure: str | None = None
        self._store_failure: str | None = None
        self._crash: BaseException | None = None
        self._lease_lost: str | None = None
        self._input_failure: str | None = None
        self._cond: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._commit_tasks: set[asyncio.Task[None]] = set()
        self._commit_lock: asyncio.Lock | None = None
        self._last_result = time.monotonic()
        self._last_commit = time.monotonic()
        retries = spec.retries
        self.retry_policy = RetryPolicy(
            retries.max_attempts, retries.backoff_seconds, retries.max_backoff_seconds
        )
        self.rand: Callable[[], float] = random.random
        """The jitter of retry backoffs (a test fixes it)."""

    # --- control ---------------------------------------------------------------------------------

    def request_stop(self, *, taken_back: bool = False) -> None:
        """Stop taking work; what is in the engine may finish. A take-back (the slot saw the
        assignment go) drains for ``drain_seconds`` — for ``cancel_drain_seconds`` when the
        batch was cancelled; any other stop (SIGTERM) for ``drain_seconds`` from now at most.
        Safe to call from a signal handler in the loop thread."""
        if not self._stopping:
            log.warning("shard %s: stop requested, draining", self.spec.shard_index)
        self._stopping = True
        if not taken_back:
            until = time.monotonic() + self.spec.drain_seconds
            self._hard_stop_until = min(until, self._hard_stop_until or until)
        self._wake()

    def engine_broke(self, reason: str) -> None:
        """The slot's engine broke (seen by another run first): this run ends as if its own
        request had met the failure — halted, what it had inside the engine suspect."""
        self._fail_engine(reason)

    def _fail_engine(self, reason: str) -> None:
        if self._engine_failure is None:
            log.error("shard %s: engine failed: %s", self.spec.shard_index, reason)
            self._engine_failure = reason
            self._crash_suspects = self.in_engine()  # what was inside when it broke
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
            or self._input_failure is not None
        )

    # --- main ------------------------------------------------------------------------------------

    async def run(self) -> Outcome:
        """Run the shard. A store that stays down, or a lease lost, ends this run only."""
        self._cond = asyncio.Condition()
        self._commit_lock = asyncio.Lock()
        try:
            return await self._run()
        except Fenced as exc:
            self._lease_lost = self._lease_lost or str(exc)
            return self._end_lease_lost()
        except StoreError as exc:
            self._store_failure = self._store_failure or str(exc)
            return await self._end_store_failed()

    async def _run(self) -> Outcome:
        await self._store_call(self.results.recover)
        self._sync_stats()
        await self._store_call(self.results.check_fence)
        await self._store_call(self.results.write_progress, state="running", done=False)
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
        if self._store_failure is None and self._input_failure is not None:
            self._store_failure = f"input unreadable: {self._input_failure}"
        if self._store_failure is not None:
            return await self._end_store_failed()
        outcome, state = self._ending(finished_reading)
        if outcome is Outcome.ENGINE_FAILED:
            await self._record_crash()
        await self._store_call(
            self.results.write_progress,
            state=state,
            done=outcome is Outcome.DONE,
            message=self.message,
        )
        self._sync_stats()
        return outcome

    def _ending(self, finished_reading: bool) -> tuple[Outcome, str]:
        """How a run that kept its lease and its store ends, and its message."""
        # A stop request wins over an engine failure that follows it (Ctrl-C reaches the engine
        # core's process group too and kills it: that is not an engine fault).
        if self._stopping:
            self.message = "preempted: stopped on request; finished results are committed"
            return Outcome.PREEMPTED, "preempted"
        if self._engine_failure is not None:
            self.message = f"engine failed: {self._engine_failure}"
            return Outcome.ENGINE_FAILED, "engine_failed"
        if not finished_reading:
            self.message = "preempted: stopped before the whole range was read"
            return Outcome.PREEMPTED, "preempted"
        self.message = None
        return Outcome.DONE, "done"

    async def _record_crash(self) -> None:
        """Lay an engine crash at the door of the requests that were inside: they are sent
        alone next time, and given up after :data:`CRASHES_TO_GIVE_UP`. Then the crash is not
        the shard's failure (no attempt) — nor when nothing of the shard was inside."""
        suspects = self._crash_suspects or set()
        if suspects:
            try:
                await self._store_call(self.results.record_crash, suspects)
            except (StoreError, Fenced) as exc:
                log.warning("shard %s: crash suspects not recorded: %s", self.spec.shard_index, exc)
                return  # the crash counts against the shard: nothing else bounds it now
            self.message = f"{self.message}; {len(suspects)} requests in the engine run alone next"
        self.crash_suspects = len(suspects)
        self.counts_attempt = False

    async def _store_call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` in a thread, retried with backoff on a store error for the shard's
        ``store_retry_seconds``; a lost lease (:class:`Fenced`) is never retried."""
        delay, deadline = 0.25, time.monotonic() + self.spec.store_retry_seconds
        while True:
            try:
                return await asyncio.to_thread(fn, *args, **kwargs)
            except StoreError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("shard %s: %s; again in %.2f s", self.spec.shard_index, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _end_lease_lost(self) -> Outcome:
        """Another slot holds the shard now: its progress record is the new holder's to write."""
        self.message = f"lease lost: {self._lease_lost}"
        log.warning("shard %s: %s", self.spec.shard_index, self.message)
        return Outcome.LEASE_LOST

    async def _end_store_failed(self) -> Outcome:
        """Never report ``done`` with results uncommitted: say why (best effort, the store is
        failing) and end the run; the next one skips what the chunks hold."""
        self.message = f"store failed: {self._store_failure}"
        try:
            await asyncio.to_thread(
                self.results.write_progress, state="failed", done=False, message=self.message
            )
        except (StoreError, Fenced) as exc:
            log.warning("shard %s: progress record not written: %s", self.spec.shard_index, exc)
        return Outcome.STORE_FAILED

    async def _feed(self) -> bool:
        """Read the range and start requests; True when the whole range was read. An input that
        stays unreadable stops the feed; what is in flight still finishes and is committed."""
        try:
            async for line_no, raw in range_lines(self.input_store, self.spec):
                if self._halted:
                    return False
                self.stats.read += 1
                request = self._request(line_no, raw)
                if request is not None and not await self._submit(request):
                    return False
        except StoreError as exc:
            log.error("shard %s: input unreadable: %s", self.spec.shard_index, exc)
            self._input_failure = str(exc)
            return False
        return not self._halted

    def _request(self, line_no: int, raw: bytes) -> EngineRequest | None:
        """The line's engine request, or None when the line is settled without the engine (a
        bad line, one with a result, one blamed for its slot's end, one given up after
        crashing the engine)."""
        try:
            request = parse_line(self.spec, line_no, raw)
        except BadLine as bad:
            self._record(self._bad(bad.custom_id, bad.message, bad.param))
            return None
        if request.custom_id in self.results.done_ids:
            self.stats.skipped += 1
            return None
        blamed = self.results.blamed.get(request.custom_id)
        if blamed is not None:  # the operator laid its slot's end at it (core.oomblame)
            self._record(self._line(request.custom_id, blamed_result(blamed)))
            return None
        crashes = self.results.suspects.get(request.custom_id, 0)
        if crashes >= CRASHES_TO_GIVE_UP:
            self._record(self._line(request.custom_id, _crashed_engine(crashes)))
            return None
        return dataclasses.replace(request, isolated=True) if crashes else request

    async def _submit(self, request: EngineRequest) -> bool:
        """Start one request once the in-flight bound allows; False when the run halted."""
        assert self._cond is not None
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
        self._spawn(self._run_one(request), self._tasks)
        return True

    async def _drain(self) -> None:
        """Wait for in-flight requests: all of them normally, a grace period when stopping."""
        until: float | None = None
        recheck = float("inf")  # when a cancel drain looks at its cancel mark again
        while self._tasks:
            if (
                self._engine_failure is not None
                or self._store_failure is not None
                or self._lease_lost is not None
            ):
                break
            timeout = 1.0
            if self._stopping:
                now = time.monotonic()
                if until is None:
                    bound = await self._drain_bound()
                    until = now + bound
                    if bound > self.spec.drain_seconds:
                        recheck = now + CANCEL_MARK_RECHECK_SECONDS
                elif now >= recheck:
                    recheck = now + CANCEL_MARK_RECHECK_SECONDS
                    if not await self._cancel_marked():  # the batch was deleted meanwhile
                        until, recheck = min(until, now + self.spec.drain_seconds), float("inf")
                if self._hard_stop_until is not None:
                    until = min(until, self._hard_stop_until)
                # short waits: a SIGTERM during a long cancel drain shortens it at once
                timeout = max(0.0, min(0.1, until - time.monotonic()))
            _, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            if pending and until is not None and time.monotonic() >= until:
                log.warning("shard %s: abandoning %d requests", self.spec.shard_index, len(pending))
                break
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _drain_bound(self) -> float:
        """How long a taken-back run lets its requests in the engine finish: the cancel bound
        when the operator marked the batch cancelled (read once, when the drain starts)."""
        cancel = self.spec.cancel_drain_seconds
        if cancel is None or not await self._cancelling():
            return self.spec.drain_seconds
        log.info(
            "shard %s: batch cancelled; %d requests in flight may finish (up to %.0f s)",
            self.spec.shard_index,
            self.stats.in_flight,
            cancel,
        )
        return cancel

    async def _cancelling(self) -> bool:
        """Whether this stopping run drains for a cancel (decided once, for the drain and the
        requests waiting to retry alike): a take-back with the cancel mark, and no SIGTERM."""
        if self._cancel_drain is None:
            cancel = self.spec.cancel_drain_seconds is not None and self._hard_stop_until is None
            decided = cancel and await self._cancel_marked()
            if self._cancel_drain is None:
                self._cancel_drain = decided
                self._wake()
        return self._cancel_drain

    async def _cancel_marked(self) -> bool:
        """Whether the operator's cancel mark is beside the shard's results (an unreadable
        store reads as no: the short drain)."""
        mark = keys.shard_cancel_key(self.spec.output_prefix)
        try:
            return await asyncio.to_thread(self.store.head, mark) is not None
        except StoreError as exc:
            log.warning("shard %s: cancel mark unreadable: %s", self.spec.shard_index, exc)
            return False

    # --- one request -----------------------------------------------------------------------------

    async def _run_one(self, request: EngineRequest) -> None:
        """Answer one request, retrying transient engine errors (``core.retries``). A request
        whose next attempt a stop cuts off records nothing: it runs again when its shard
        resumes. A cancel's drain lets it finish, retries included (:meth:`_pause`); past the
        drain's bound it becomes a ``batch_cancelled`` line."""
        self._in_flight.add(request.custom_id)
        try:
            attempt = 1
            while True:
                result = await self._attempt(request)
                if result is None:
                    return  # the engine failed: the run ends, the request runs again
                self._last_result = time.monotonic()
                code = error_code(result.body)
                delay = retry_after(self.retry_policy, attempt, result.status_code, code, self.rand)
                if delay is None:
                    break
                log.info(
                    "request %s: attempt %d answered %d; again in %.2f s",
                    request.custom_id,
                    attempt,
                    result.status_code,
                    delay,
                )
                self._in_flight.discard(request.custom_id)  # not in the engine while it waits
                if not await self._pause(delay):
                    return
                self._in_flight.add(request.custom_id)
                attempt += 1
            if not result.ok and is_transient(result.status_code, code):
                noted = with_attempts(result.body, attempt)
                result = dataclasses.replace(result, body=noted)
            self._record(self._line(request.custom_id, result))
        finally:
            self._in_flight.discard(request.custom_id)
            self.stats.in_flight -= 1
            self._wake()

    async def _attempt(self, request: EngineRequest) -> EngineResult | None:
        """One attempt's answer, or None when the engine failed (the run is halted)."""
        try:
            result = await self.engine.handle(request)
        except EngineDead as exc:
            self._fail_engine(str(exc) or "engine dead")
            return None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine bug for one request: a 500 answer, not a crash
            log.exception("request %s raised", request.custom_id)
            dead = self.engine.dead_reason()
            if dead is not None:
                self._fail_engine(dead)
                return None
            return EngineResult(500, error_body(f"{type(exc).__name__}: {exc}", status_code=500))
        if result.status_code >= 500:
            dead = self.engine.dead_reason()
            if dead is not None:  # not a real answer: the request never ran
                self._fail_engine(dead)
                return None
        return result

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` before a retry; False when the run halted meanwhile — but for a
        cancel's drain, in which the request is running and finishes, its retries included
        (until the drain's bound, or a SIGTERM, ends the run)."""
        assert self._cond is not None
        until = time.monotonic() + seconds

        def undecided() -> bool:  # stopped: for a cancel (this request finishes) or not?
            return self._stopping and self._cancel_drain is None

        while not self._retries_cut() and (left := until - time.monotonic()) > 0:
            async with self._cond:
                with contextlib.suppress(TimeoutError):
                    ready = self._cond.wait_for(lambda: self._retries_cut() or undecided())
                    await asyncio.wait_for(ready, left)
            if undecided():
                await self._cancelling()
        return not self._retries_cut()

    def _retries_cut(self) -> bool:
        """Whether a request waiting for its next attempt gives up now."""
        if not self._stopping or self._cancel_drain is False or self._hard_stop_until is not None:
            return self._halted
        # a cancel's drain (or one not decided yet): only a failure of the run cuts the wait
        failures = (self._engine_failure, self._store_failure, self._crash, self._lease_lost)
        return any(f is not None for f in failures) or self._input_failure is not None

    def _line(self, custom_id: str, result: EngineResult) -> ResultLine:
        uid = self.spec.batch_uid
        return result_line(
            line_id=batch_request_id(uid, custom_id),
            custom_id=custom_id,
            status_code=result.status_code,
            request_id=request_id(uid, custom_id),
            body=result.body,
            busy_seconds=result.busy_seconds,
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

        Under a lease every write checks that the lease is still ours (``ShardResults``): once
        another slot holds the shard nothing more is written (the new holder re-runs what is
        not committed)."""
        assert self._commit_lock is not None
        async with self._commit_lock:
            delay = 0.25
            deadline = time.monotonic() + self.spec.store_retry_seconds
            while self.results.pending_count:
                self._last_commit = time.monotonic()
                try:
                    await self._commit_once()
                    return
                except Fenced as exc:
                    self._lease_lost = self._lease_lost or str(exc)
                    self._wake()
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
            # strictly after it; lines it could not write go back to the pending ones. The
            # cancellation always goes on: a commit that found the lease lost must not replace
            # it (the timer would swallow the error and loop, and the run never end).
            try:
                await write
            except CommitFailed as exc:
                self.results.restore(exc.unwritten)
            except Fenced as exc:
                self._lease_lost = self._lease_lost or str(exc)
            raise

    def _sync_stats(self) -> None:
        p = self.results.progress
        self.stats.completed = p.completed
        self.stats.failed = p.failed
        self.stats.input_tokens = p.input_tokens
        self.stats.output_tokens = p.output_tokens
        self.stats.total_tokens = p.total_tokens

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


def blamed_result(code: str) -> EngineResult:
    """The error answer of a request the operator blamed for its slot's end."""
    return EngineResult(400, error_body(blame_message(code), status_code=400, code=code))


def _crashed_engine(crashes: int) -> EngineResult:
    """The error answer of a request given up because the engine crashed under it."""
    message = (
        f"This request was in the engine at each of {crashes} engine crashes (the last time "
        "alone) and is not run again: it appears to crash the model server."
    )
    body = error_body(message, status_code=500, code="request_crashed_engine")
    return EngineResult(500, body)
