"""The simulated engine: deterministic, OpenAI-shaped, marked, with failure injection."""

from __future__ import annotations

import asyncio
from typing import Any

import openai.types
import openai.types.chat
import pytest

from llmbatch.api.shard import EngineSpec, ModelRef
from llmbatch.executor.engines import EngineConfigError, EngineRequest, create_engine
from llmbatch.executor.engines.simulated import FINGERPRINT, SimulatedEngine


def _ask(engine: SimulatedEngine, url: str, body: dict[str, Any], cid: str = "c1") -> Any:
    return asyncio.run(engine.handle(EngineRequest(cid, url, body, "req_x")))


def test_chat_completion_and_embeddings_parse_with_the_sdk() -> None:
    engine = SimulatedEngine({"embedding_dim": 5}, ["m"])
    chat = _ask(
        engine,
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 4},
    )
    parsed = openai.types.chat.ChatCompletion.model_validate(chat.body)
    assert parsed.system_fingerprint == FINGERPRINT
    assert parsed.usage is not None
    assert parsed.usage.completion_tokens == 4
    assert parsed.choices[0].finish_reason == "length"

    completion = _ask(engine, "/v1/completions", {"model": "m", "prompt": "hello"})
    assert openai.types.Completion.model_validate(completion.body).choices[0].text

    emb = _ask(engine, "/v1/embeddings", {"model": "m", "input": ["x", "y"]})
    parsed_emb = openai.types.CreateEmbeddingResponse.model_validate(emb.body)
    assert [len(d.embedding) for d in parsed_emb.data] == [5, 5]


def test_answers_are_deterministic() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "same"}]}
    one = _ask(SimulatedEngine({}, ["m"]), "/v1/chat/completions", body)
    two = _ask(SimulatedEngine({}, ["m"]), "/v1/chat/completions", body)
    assert one == two


def test_failure_injection_by_pattern_and_rate() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    engine = SimulatedEngine({"fail_pattern": "^bad-", "fail_status": 503}, ["m"])
    assert _ask(engine, "/v1/chat/completions", body, "bad-1").status_code == 503
    assert _ask(engine, "/v1/chat/completions", body, "good-1").status_code == 200

    engine = SimulatedEngine({"fail_rate": 0.3, "seed": 1}, ["m"])
    statuses = [_ask(engine, "/v1/chat/completions", body, f"r{i}").status_code for i in range(200)]
    assert 30 < statuses.count(500) < 90
    again = SimulatedEngine({"fail_rate": 0.3, "seed": 1}, ["m"])
    assert statuses == [
        _ask(again, "/v1/chat/completions", body, f"r{i}").status_code for i in range(200)
    ]


def test_bad_args_are_config_errors() -> None:
    with pytest.raises(EngineConfigError):
        SimulatedEngine({"no_such_arg": 1}, ["m"])
    with pytest.raises(EngineConfigError):
        SimulatedEngine({"fail_pattern": "("}, ["m"])
    engine = create_engine(EngineSpec(name="simulated"), ModelRef(name="m", path="x"), ["m"])
    assert engine.name == "simulated"
    assert engine.max_num_seqs == 32


def test_vllm_engine_args_become_flags() -> None:
    from llmbatch.executor.engines.vllm import engine_argv

    argv = engine_argv(
        ModelRef(name="m", path="/p"),
        ["m", "alias"],
        {"max_num_seqs": 4, "enforce_eager": True, "enable_chunked_prefill": False, "x": None},
    )
    assert argv == [
        "--model", "/p", "--served-model-name", "m", "alias",
        "--max-num-seqs", "4", "--enforce-eager", "--no-enable-chunked-prefill",
    ]  # fmt: skip
    with pytest.raises(EngineConfigError):
        engine_argv(ModelRef(name="m", path="/p"), ["m"], {"model": "other"})


def test_responses_are_response_objects_with_responses_usage() -> None:
    import openai.types.responses

    engine = SimulatedEngine({"default_output_tokens": 6}, ["m"])
    body = {"model": "m", "input": "one two three", "instructions": "be brief"}
    short = _ask(engine, "/v1/responses", {**body, "max_output_tokens": 4})
    parsed = openai.types.responses.Response.model_validate(short.body)
    assert (parsed.object, parsed.model, parsed.status) == ("response", "m", "incomplete")
    assert parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"
    assert len(parsed.output_text.split()) == 4
    assert parsed.usage is not None
    assert (parsed.usage.input_tokens, parsed.usage.output_tokens) == (5, 4)
    assert parsed.usage.total_tokens == 9
    items = [{"role": "user", "content": "hi"}]
    full = _ask(engine, "/v1/responses", {"model": "m", "input": items, "max_output_tokens": 64})
    done = openai.types.responses.Response.model_validate(full.body)
    assert (done.status, done.incomplete_details) == ("completed", None)
    assert done.usage is not None
    assert done.usage.output_tokens == 6
    assert _ask(engine, "/v1/responses", {"model": "m"}).status_code == 400
    long = _ask(SimulatedEngine({"max_model_len": 3}, ["m"]), "/v1/responses", body)
    assert long.status_code == 400
    assert long.body["error"]["code"] == "context_length_exceeded"
    assert long.body["error"]["param"] == "input"


def test_responses_latency_counts_output_tokens() -> None:
    engine = SimulatedEngine({"tokens_per_second": 40, "default_output_tokens": 8}, ["m"])
    loop = asyncio.new_event_loop()
    try:
        started = loop.time()
        request = EngineRequest("c1", "/v1/responses", {"model": "m", "input": "x"}, "req_x")
        loop.run_until_complete(engine.handle(request))
        assert loop.time() - started >= 8 / 40
    finally:
        loop.close()


def _order_of_completion(policy: str) -> list[str]:
    """Four standard requests (priority 1), then two expedited (priority 0), on an engine whose
    running batch holds one request (s0 is running when the expedited ones arrive): the order
    the answers come back in."""
    engine = SimulatedEngine(
        {"latency_seconds": 0.02, "max_running": 1, "scheduling_policy": policy}, ["m"]
    )
    done: list[str] = []

    async def ask(cid: str, priority: int) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": cid}]}
        await engine.handle(EngineRequest(cid, "/v1/chat/completions", body, cid, priority))
        done.append(cid)

    async def go() -> None:
        standard = [asyncio.ensure_future(ask(f"s{i}", 1)) for i in range(4)]
        await asyncio.sleep(0)  # the standard requests are in the engine (one runs, three wait)
        expedited = [asyncio.ensure_future(ask(f"e{i}", 0)) for i in range(2)]
        await asyncio.gather(*standard, *expedited)

    asyncio.run(go())
    return done


def test_with_the_priority_policy_better_requests_take_running_and_queued_places() -> None:
    """As the executor's vLLM scheduler does (engines.tiersched): the expedited requests take the
    running standard one's place (it resumes first after them) and go ahead of the queue."""
    assert _order_of_completion("priority") == ["e0", "e1", "s0", "s1", "s2", "s3"]
    assert _order_of_completion("fcfs") == ["s0", "s1", "s2", "s3", "e0", "e1"]


def test_preempted_requests_answer_once_and_the_batch_never_overflows() -> None:
    """Mixed priorities and cancellations (of requests running, queued or preempted, wherever
    each happens to be): every request not cancelled is answered once, the running batch never
    holds more than max_running, and the engine ends empty (no place leaked)."""
    engine = SimulatedEngine({"latency_seconds": 0.01, "max_running": 3}, ["m"])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    answered: list[str] = []
    peak = 0

    async def ask(i: int) -> None:
        request = EngineRequest(f"r{i}", "/v1/chat/completions", body, f"r{i}", priority=i % 3)
        assert (await engine.handle(request)).ok
        answered.append(request.custom_id)

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, len(engine._seats))
            await asyncio.sleep(0.001)

    async def go() -> None:
        watcher = asyncio.ensure_future(watch())
        tasks = []
        for i in range(60):
            tasks.append(asyncio.ensure_future(ask(59 - i)))  # better priorities keep arriving
            await asyncio.sleep(0.002)
            if i % 7 == 3:
                tasks[i - 2].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        watcher.cancel()
        cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
        assert len(answered) + len(cancelled) == 60
        assert len(set(answered)) == len(answered)

    asyncio.run(go())
    assert peak <= 3
    assert not engine._seats
    assert all(f.done() for _, _, f in engine._queue)


def test_a_cancelled_wait_gives_its_place_on() -> None:
    engine = SimulatedEngine({"latency_seconds": 0.02, "max_running": 1}, ["m"])
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}

    async def go() -> None:
        first = asyncio.ensure_future(
            engine.handle(EngineRequest("a", "/v1/completions", {"model": "m", "prompt": "x"}, "a"))
        )
        waiting = asyncio.ensure_future(
            engine.handle(EngineRequest("b", "/v1/chat/completions", body, "b"))
        )
        await asyncio.sleep(0)
        waiting.cancel()
        await first
        # a new request is admitted, not stuck behind the cancelled wait
        third = engine.handle(EngineRequest("c", "/v1/chat/completions", body, "c"))
        assert (await asyncio.wait_for(third, 1)).ok
        assert waiting.cancelled()

    asyncio.run(go())
