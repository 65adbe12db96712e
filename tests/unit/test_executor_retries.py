"""Per-request retries, a cancelled batch's drain and the busy time charged, on the real shard
runner with the simulated engine's fault options (seed 002: "Failed requests are retried. You
are billed once per completed request."; "Cancel requested. Running requests finish.")."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from llmbatch.core.keys import shard_cancel_key
from llmbatch.executor.engines.simulated import SimulatedEngine
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.executor.sharedengine import BusyLedger, EngineGate, SharedEngine
from llmbatch.storage.shardresults import read_progress
from tests.unit.test_executor_chunks import MemoryStore
from tests.unit.test_executor_runner import PREFIX, _input, _lines, _request, _spec

RETRIES = {"max_attempts": 3, "backoff_seconds": 0.01, "max_backoff_seconds": 0.05}


def _run(store: MemoryStore, engine: SimulatedEngine, **spec: Any) -> tuple[Outcome, ShardRunner]:
    async def go() -> tuple[Outcome, ShardRunner]:
        runner = ShardRunner(_spec(**spec), engine, store)
        return await runner.run(), runner

    return asyncio.run(go())


def _store(n: int) -> MemoryStore:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(n)]))
    return store


def test_a_transient_engine_error_is_retried_until_it_answers() -> None:
    store = _store(4)
    args = {"fail_pattern": "^r1$", "fail_status": 503, "fail_attempts": 2}
    engine = SimulatedEngine(args, ["m"])
    outcome, runner = _run(store, engine, retries=RETRIES)
    assert outcome is Outcome.DONE
    assert sorted(line["custom_id"] for line in _lines(store, "output")) == ["r0", "r1", "r2", "r3"]
    assert _lines(store, "errors") == []
    assert engine.failures == {"r1": 2}
    assert runner.stats.completed == 4


def test_a_request_that_keeps_failing_says_how_many_attempts_it_had() -> None:
    store = _store(3)
    engine = SimulatedEngine({"fail_pattern": "^r2$", "fail_status": 500}, ["m"])
    outcome, _ = _run(store, engine, retries=RETRIES)
    assert outcome is Outcome.DONE
    (line,) = _lines(store, "errors")
    assert line["custom_id"] == "r2"
    assert line["error"] is None
    assert line["response"]["status_code"] == 500
    error = line["response"]["body"]["error"]
    assert error["message"].startswith("Simulated failure for r2.")
    assert "failed after 3 attempts" in error["message"]
    assert set(error) == {"message", "type", "param", "code"}  # the OpenAI envelope, kept
    assert engine.failures == {"r2": 3}


@pytest.mark.parametrize("status", [400, 404, 409, 422])
def test_the_callers_own_errors_are_never_retried(status: int) -> None:
    store = _store(2)
    engine = SimulatedEngine({"fail_pattern": "^r0$", "fail_status": status}, ["m"])
    _run(store, engine, retries=RETRIES)
    (line,) = _lines(store, "errors")
    assert line["response"]["status_code"] == status
    assert "attempt" not in line["response"]["body"]["error"]["message"]
    assert engine.failures == {"r0": 1}


def test_without_retries_a_transient_error_is_final_after_one_attempt() -> None:
    store = _store(1)
    engine = SimulatedEngine({"fail_pattern": ".", "fail_status": 503}, ["m"])
    _run(store, engine)  # a spec without `retries`: an older operator's, no retry
    (line,) = _lines(store, "errors")
    assert "failed after 1 attempt;" in line["response"]["body"]["error"]["message"]
    assert engine.failures == {"r0": 1}


def test_a_stop_during_a_retrys_backoff_records_nothing_for_it() -> None:
    store = _store(1)
    engine = SimulatedEngine({"fail_pattern": ".", "fail_status": 503}, ["m"])
    slow = {"max_attempts": 3, "backoff_seconds": 30.0, "max_backoff_seconds": 30.0}

    async def go() -> tuple[Outcome, ShardRunner, float]:
        runner = ShardRunner(_spec(retries=slow, drain_seconds=60.0), engine, store)
        task = asyncio.create_task(runner.run())
        while not engine.failures:
            await asyncio.sleep(0.005)
        asked = time.monotonic()
        runner.request_stop(taken_back=True)
        return await task, runner, time.monotonic() - asked

    outcome, runner, took = asyncio.run(go())
    assert outcome is Outcome.PREEMPTED
    assert took < 5  # the backoff is cut short, not waited out
    assert _lines(store, "errors") == [] == _lines(store, "output")  # runs again on resume
    assert runner.stats.in_flight == 0


@pytest.mark.parametrize("marked", [True, False])
def test_a_request_between_attempts_at_a_cancel_finishes(marked: bool) -> None:
    """Seed 002: "Cancel requested. Running requests finish." A request already running whose
    first attempt met a transient error is waiting for its next when the batch is cancelled:
    it is tried again and its answer committed, not cut off into a batch_cancelled line. Any
    other take-back still cuts the wait (it runs again when its shard resumes)."""
    store = _store(1)
    if marked:
        store.put(shard_cancel_key(PREFIX), b"{}")
    engine = SimulatedEngine({"fail_pattern": ".", "fail_status": 503, "fail_attempts": 1}, ["m"])
    backoff = {"max_attempts": 3, "backoff_seconds": 0.3, "max_backoff_seconds": 0.3}
    spec = _spec(retries=backoff, drain_seconds=0.05, cancel_drain_seconds=30.0)

    async def go() -> Outcome:
        runner = ShardRunner(spec, engine, store)
        runner.rand = lambda: 0.5  # the backoff without jitter
        task = asyncio.create_task(runner.run())
        while not engine.failures:
            await asyncio.sleep(0.005)
        runner.request_stop(taken_back=True)  # in the middle of its 0.3 s backoff
        return await task

    assert asyncio.run(go()) is Outcome.PREEMPTED
    finished = [line["custom_id"] for line in _lines(store, "output")]
    assert finished == (["r0"] if marked else [])
    assert engine.failures == {"r0": 1}
    assert _lines(store, "errors") == []


def _cancel_run(*, marked: bool, sigterm_after: float | None = None) -> tuple[list[str], float]:
    """Four requests of 1 s in the engine when the shard is taken back; the drain bound is
    0.2 s, a cancel's 30 s."""
    store = _store(20)
    if marked:
        store.put(shard_cancel_key(PREFIX), b"{}")
    engine = SimulatedEngine({"max_num_seqs": 2, "latency_seconds": 1.0}, ["m"])
    spec = _spec(drain_seconds=0.2, cancel_drain_seconds=30.0, flush_lines=1000)

    async def go() -> float:
        runner = ShardRunner(spec, engine, store)
        task = asyncio.create_task(runner.run())
        while runner.stats.in_flight < 4:
            await asyncio.sleep(0.005)
        asked = time.monotonic()
        runner.request_stop(taken_back=True)
        if sigterm_after is not None:
            await asyncio.sleep(sigterm_after)
            runner.request_stop()
        assert await task is Outcome.PREEMPTED
        return time.monotonic() - asked

    took = asyncio.run(go())
    return sorted(line["custom_id"] for line in _lines(store, "output")), took


def test_a_cancelled_shards_requests_in_the_engine_finish_and_are_committed() -> None:
    done, took = _cancel_run(marked=True)
    assert done == ["r0", "r1", "r2", "r3"]  # everything that was in flight, nothing new
    assert 0.5 < took < 10


def test_any_other_take_back_cuts_them_after_the_short_drain() -> None:
    done, _ = _cancel_run(marked=False)
    assert done == []  # cut before their 1 s was up


def test_sigterm_during_a_cancel_drain_bounds_it_by_the_pod_grace() -> None:
    # the pod's grace (drain_seconds from the SIGTERM) wins over the cancel bound
    done, _ = _cancel_run(marked=True, sigterm_after=0.1)
    assert done == []


def test_busy_time_is_charged_for_committed_results_only() -> None:
    # requests cut off at the end of a drain used the engine but left no result: they run
    # again later, and only that run's share is charged (re-run work is not charged twice)
    store = _store(40)
    inner = SimulatedEngine({"max_num_seqs": 2, "latency_seconds": 0.3}, ["m"])
    ledger = BusyLedger()
    on_record = asyncio.Event()
    on_record.set()
    spec = _spec(drain_seconds=0.05, flush_lines=1000)

    async def go() -> ShardRunner:
        engine = SharedEngine(inner, ledger, EngineGate(), "k", on_record)
        runner = ShardRunner(spec, engine, store)
        task = asyncio.create_task(runner.run())
        while runner.stats.completed < 4:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.1)  # four more in the engine, 0.1 s into their 0.3 s
        runner.request_stop()
        assert await task is Outcome.PREEMPTED
        return runner

    asyncio.run(go())
    progress = read_progress(store, PREFIX)
    assert progress is not None
    used = ledger.share("k")
    assert progress.completed >= 4
    assert progress.busy_seconds > 0
    # four requests were cut off ≥ 0.1 s into their run, a quarter of the engine each
    assert progress.busy_seconds < used - 0.05

    # the resumed run keeps the first run's committed shares and adds its own
    first = progress.busy_seconds
    fresh = SimulatedEngine({"max_num_seqs": 2, "latency_seconds": 0.01}, ["m"])  # a new loop
    resumed = ShardRunner(spec, SharedEngine(fresh, ledger, EngineGate(), "k2", on_record), store)
    assert asyncio.run(resumed.run()) is Outcome.DONE
    final = read_progress(store, PREFIX)
    assert final is not None
    assert final.completed == 40
    assert final.busy_seconds == pytest.approx(first + ledger.share("k2"), rel=0.05)


def test_a_cancel_drain_ends_soon_after_its_mark_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # the Batch was deleted while its requests finished: its work area (the mark with it) is
    # removed, and the drain falls back to the short bound
    monkeypatch.setattr("llmbatch.executor.runner.CANCEL_MARK_RECHECK_SECONDS", 0.2)
    store = _store(8)
    store.put(shard_cancel_key(PREFIX), b"{}")
    engine = SimulatedEngine({"max_num_seqs": 2, "latency_seconds": 3.0}, ["m"])
    spec = _spec(drain_seconds=0.2, cancel_drain_seconds=30.0, flush_lines=1000)

    async def go() -> float:
        runner = ShardRunner(spec, engine, store)
        task = asyncio.create_task(runner.run())
        while runner.stats.in_flight < 4:
            await asyncio.sleep(0.005)
        runner.request_stop(taken_back=True)
        await asyncio.sleep(0.3)  # the long drain has begun
        store.delete(shard_cancel_key(PREFIX))
        asked = time.monotonic()
        await task
        return time.monotonic() - asked

    assert asyncio.run(go()) < 1.5  # not the 3 s the requests would need
    assert _lines(store, "output") == []
