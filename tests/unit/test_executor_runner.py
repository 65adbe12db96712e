"""The shard runner on the simulated engine: bad lines, resume, stop, engine death, watchdog."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson
import pytest

from llmbatch.api.openai import BatchOutputLine
from llmbatch.api.shard import ShardSpec
from llmbatch.core.ids import batch_request_id, request_id
from llmbatch.executor.engines.simulated import SimulatedEngine
from llmbatch.executor.runner import Outcome, RunnerCrashed, ShardRunner
from llmbatch.storage.base import StoreError
from llmbatch.storage.shardresults import list_chunks, read_progress
from tests.unit.test_executor_chunks import MemoryStore

PREFIX = "u1/shards/00000"


def _request(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "m",
            "messages": [{"role": "user", "content": f"question {i}"}],
            "max_tokens": 8,
            **body,
        },
    }


def _input(rows: list[dict[str, Any] | str]) -> bytes:
    return b"".join(
        (row.encode() if isinstance(row, str) else orjson.dumps(row)) + b"\n" for row in rows
    )


def _spec(**changes: Any) -> ShardSpec:
    base: dict[str, Any] = {
        "batch_id": "batch_1",
        "batch_uid": "u1",
        "endpoint": "/v1/chat/completions",
        "store": "file:///unused",
        "input_key": "in.jsonl",
        "output_prefix": PREFIX,
        "model": {"name": "m", "path": "/nowhere"},
        "engine": {"name": "simulated", "args": {}},
        "flush_lines": 4,
        "flush_seconds": 0.2,
    }
    base.update(changes)
    return ShardSpec.model_validate(base)


def _run(store: MemoryStore, spec: ShardSpec, engine_args: dict[str, Any] | None = None):
    engine = SimulatedEngine(engine_args or {}, spec.served_names())

    async def go() -> tuple[Outcome, ShardRunner]:
        runner = ShardRunner(spec, engine, store)
        return await runner.run(), runner

    return asyncio.run(go())


def _lines(store: MemoryStore, kind: str) -> list[dict[str, Any]]:
    out = []
    for key in list_chunks(store, PREFIX, kind):  # type: ignore[arg-type]
        out += [orjson.loads(raw) for raw in store.get(key).splitlines()]
    return out


def test_runs_every_line_with_contract_ids() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(10)]))
    outcome, runner = _run(store, _spec())
    assert outcome is Outcome.DONE
    lines = _lines(store, "output")
    assert sorted(line["custom_id"] for line in lines) == sorted(f"r{i}" for i in range(10))
    for line in lines:
        parsed = BatchOutputLine.model_validate(line)
        assert parsed.id == batch_request_id("u1", parsed.custom_id)
        assert parsed.response is not None
        assert parsed.response.request_id == request_id("u1", parsed.custom_id)
        assert parsed.response.status_code == 200
        assert parsed.response.body["system_fingerprint"] == "llmbatch-simulated"
        assert parsed.error is None
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.done
    assert progress.state == "done"
    assert progress.completed == 10
    assert progress.failed == 0
    assert progress.output_tokens == 80 == runner.stats.output_tokens


def test_bad_lines_become_error_lines_and_never_abort() -> None:
    store = MemoryStore()
    rows: list[dict[str, Any] | str] = [
        _request(0),
        "{not json",
        {"custom_id": "nourl", "method": "POST", "body": {}},
        {**_request(3), "url": "/v1/embeddings"},
        _request(4, stream=True),
        "[1, 2]",
        _request(6),
    ]
    store.put("in.jsonl", _input(rows))
    outcome, _ = _run(store, _spec())
    assert outcome is Outcome.DONE
    assert sorted(line["custom_id"] for line in _lines(store, "output")) == ["r0", "r6"]
    errors = {line["custom_id"]: line for line in _lines(store, "errors")}
    assert set(errors) == {"__line_2", "nourl", "r3", "r4", "__line_6"}
    for line in errors.values():
        assert line["error"] is None
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["type"] == "invalid_request_error"


def test_engine_rejections_are_error_lines() -> None:
    store = MemoryStore()
    long_prompt = " ".join(["word"] * 50)
    rows: list[dict[str, Any] | str] = [
        _request(0),
        {**_request(1), "body": {**_request(1)["body"], "model": "other"}},
        {
            **_request(2),
            "body": {**_request(2)["body"], "messages": [{"role": "user", "content": long_prompt}]},
        },
    ]
    store.put("in.jsonl", _input(rows))
    outcome, _ = _run(store, _spec(), {"max_model_len": 20})
    assert outcome is Outcome.DONE
    errors = {line["custom_id"]: line["response"] for line in _lines(store, "errors")}
    assert errors["r1"]["status_code"] == 404
    assert errors["r1"]["body"]["error"]["code"] == "model_not_found"
    assert errors["r2"]["status_code"] == 400
    assert errors["r2"]["body"]["error"]["code"] == "context_length_exceeded"


def test_byte_range_and_line_numbers() -> None:
    store = MemoryStore()
    data = _input([_request(i) for i in range(6)])
    store.put("in.jsonl", data + b"{bad\n")
    cut = data.index(b'{"custom_id":"r3"')
    outcome, _ = _run(store, _spec(start=cut, first_line=4))
    assert outcome is Outcome.DONE
    assert sorted(line["custom_id"] for line in _lines(store, "output")) == ["r3", "r4", "r5"]
    assert [line["custom_id"] for line in _lines(store, "errors")] == ["__line_7"]


def test_resume_skips_committed_results() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(12)]))
    # a previous attempt committed r0..r4 (r2 failed), then died
    store.put("short.jsonl", _input([_request(i) for i in range(5)]))
    args = {"fail_pattern": "^r2$", "fail_status": 400}
    _run(store, _spec(input_key="short.jsonl"), args)
    outcome, runner = _run(store, _spec(), args)
    assert outcome is Outcome.DONE
    assert runner.stats.skipped == 5
    ids = [line["custom_id"] for line in _lines(store, "output") + _lines(store, "errors")]
    assert sorted(ids) == sorted(f"r{i}" for i in range(12))
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert (progress.completed, progress.failed, progress.attempts) == (11, 1, 2)


def test_in_flight_is_bounded() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(40)]))
    spec = _spec()
    engine = SimulatedEngine({"max_num_seqs": 3, "latency_seconds": 0.01}, spec.served_names())
    peak = 0

    async def go() -> Outcome:
        nonlocal peak
        runner = ShardRunner(spec, engine, store)
        assert runner.max_in_flight == 6
        task = asyncio.create_task(runner.run())
        while not task.done():
            peak = max(peak, runner.stats.in_flight)
            await asyncio.sleep(0.001)
        return await task

    assert asyncio.run(go()) is Outcome.DONE
    assert 1 <= peak <= 6


def test_stop_commits_finished_results_and_reports_preempted() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(200)]))
    spec = _spec(drain_seconds=5.0, flush_lines=1000, flush_seconds=60)
    engine = SimulatedEngine({"max_num_seqs": 2, "latency_seconds": 0.02}, spec.served_names())

    async def go() -> tuple[Outcome, ShardRunner]:
        runner = ShardRunner(spec, engine, store)
        task = asyncio.create_task(runner.run())
        while runner.stats.completed < 10:
            await asyncio.sleep(0.005)
        runner.request_stop()
        return await task, runner

    outcome, runner = asyncio.run(go())
    assert outcome is Outcome.PREEMPTED
    lines = _lines(store, "output")
    assert len(lines) == runner.stats.completed == engine.answered
    assert 10 <= len(lines) < 200
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.state == "preempted"
    assert not progress.done


def test_engine_death_is_a_shard_failure_not_500_lines() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(50)]))
    outcome, runner = _run(store, _spec(), {"die_after": 7, "max_num_seqs": 2})
    assert outcome is Outcome.ENGINE_FAILED
    assert runner.message is not None
    assert "engine" in runner.message
    lines = _lines(store, "output")
    assert len(lines) == 7
    assert _lines(store, "errors") == []
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.state == "engine_failed"
    assert not progress.done


def test_watchdog_catches_a_hung_engine() -> None:
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(20)]))
    outcome, runner = _run(store, _spec(watchdog_seconds=0.5), {"hang_after": 5})
    assert outcome is Outcome.ENGINE_FAILED
    assert runner.message is not None
    assert "hung" in runner.message
    assert len(_lines(store, "output")) == 5


def test_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="end"):
        _spec(start=10, end=5)
    with pytest.raises(ValueError, match="output_prefix"):
        _spec(output_prefix="/")
    with pytest.raises(ValueError):
        _spec(engine={"name": "nope"})
    assert _spec(output_prefix="a/b/").output_prefix == "a/b"
    assert json.loads(_spec().model_dump_json())["engine"]["name"] == "simulated"


class FlakyStore(MemoryStore):
    """A MemoryStore whose puts of keys containing ``fail_on`` raise ``failures`` times."""

    def __init__(self, fail_on: str, failures: int) -> None:
        super().__init__()
        self.fail_on = fail_on
        self.failures = failures
        self.refused = 0

    def put(self, key: str, data: Any, *, if_absent: bool = False) -> Any:
        if self.fail_on in key and self.refused < self.failures:
            self.refused += 1
            raise StoreError(f"injected: 503 SlowDown on {key}")
        return super().put(key, data, if_absent=if_absent)


def test_a_failed_chunk_commit_is_retried_and_loses_nothing() -> None:
    # The first put of output-00000 fails once (a transient store error). Before the fix the
    # commit task took the lines out of the buffer, died silently, and the run still said done
    # with 2 of 4 results committed.
    store = FlakyStore("output-00000", failures=1)
    store.put("in.jsonl", _input([_request(i) for i in range(4)]))
    outcome, _runner = _run(store, _spec(flush_lines=2, flush_seconds=30))
    assert outcome is Outcome.DONE
    assert store.refused == 1
    ids = sorted(line["custom_id"] for line in _lines(store, "output"))
    assert ids == ["r0", "r1", "r2", "r3"]
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.done
    assert progress.completed == 4


def test_a_store_that_stays_down_ends_the_run_store_failed_never_done() -> None:
    store = FlakyStore("output-", failures=10**6)
    store.put("in.jsonl", _input([_request(i) for i in range(6)]))
    outcome, runner = _run(store, _spec(flush_lines=2, flush_seconds=30, store_retry_seconds=0.3))
    assert outcome is Outcome.STORE_FAILED
    assert runner.message is not None
    assert "injected" in runner.message
    assert _lines(store, "output") == []
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert not progress.done
    assert progress.state == "failed"
    # The next run (the Job's retry) resumes and commits every result exactly once.
    store.failures = 0
    outcome, _ = _run(store, _spec(flush_lines=2, flush_seconds=30))
    assert outcome is Outcome.DONE
    assert sorted(line["custom_id"] for line in _lines(store, "output")) == [
        f"r{i}" for i in range(6)
    ]


def test_a_crashed_request_task_is_never_lost() -> None:
    # An engine answer the runner cannot serialise makes the request's task raise. Before the
    # fix the exception vanished with the task and the run reported done without that result.
    class OddEngine(SimulatedEngine):
        async def handle(self, request: Any) -> Any:
            result = await super().handle(request)
            if request.custom_id == "r1":
                result.body["odd"] = {1, 2}  # not JSON
            return result

    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(3)]))
    spec = _spec()

    async def go() -> None:
        runner = ShardRunner(spec, OddEngine({}, spec.served_names()), store)
        await runner.run()

    with pytest.raises(RunnerCrashed):
        asyncio.run(go())
    progress = read_progress(store, PREFIX)
    assert progress is None or not progress.done


class SlowLostFence:
    """A fence whose third check (the flush timer's commit) blocks until released, then says
    the lease is lost: the run ends while that commit is still in its thread."""

    def __init__(self) -> None:
        import threading

        self.calls = 0
        self.release = threading.Event()

    def lost(self) -> str | None:
        self.calls += 1
        if self.calls < 3:
            return None
        self.release.wait(10)
        return "lease generation 2 (slot other) replaced ours (1)"


def test_a_commit_fenced_out_while_the_run_ends_does_not_keep_the_run_open() -> None:
    """Found by the blast-radius sweep (#31): the flush timer, cancelled as the run ended,
    waited for its commit in flight; that commit found the lease lost, and the Fenced error
    replaced the cancellation, so the timer swallowed it and looped for ever, and the run —
    its shard, its slot seat — never ended."""
    store = MemoryStore()
    store.put("in.jsonl", _input([_request(i) for i in range(4)]))
    spec = _spec(flush_lines=1000, flush_seconds=0.1, max_in_flight=2)
    fence = SlowLostFence()

    async def go() -> Outcome:
        engine = SimulatedEngine({"latency_seconds": 0.3}, spec.served_names())
        runner = ShardRunner(spec, engine, store, fence=fence, generation=1)
        run = asyncio.ensure_future(runner.run())
        await asyncio.sleep(1.0)  # the flush timer's commit is held in the fence; run ended
        fence.release.set()
        return await asyncio.wait_for(run, 5)

    assert asyncio.run(go()) is Outcome.LEASE_LOST
