"""The executor on the real vLLM CPU engine (SmolLM2 for chat/completions, MiniLM for embeddings).

Engine starts are the cost here (15 s import + 10-60 s start on 2 cores), so they are few:

* one in-process SmolLM2 engine (module fixture) runs a chat, a completions and a responses shard
  at once (with retries on: vLLM's own 4xx answers are final at once), then a cancelled shard whose
  requests in the engine finish;
* one executor subprocess is stopped with SIGTERM (exit 75), its retry is SIGKILLed mid-shard, and
  a third run finishes the shard: exactly one line per custom_id, no finished result lost;
* one executor subprocess hits vLLM's CPU seed + chunked-prefill bug: the engine core dies and the
  shard fails with exit 70 (``vllm run-batch`` would write a 500 for every row and exit 0);
* one ``llmbatch run`` subprocess serves embeddings with MiniLM;
* one engine running one request at a time shows expedited requests taking the seat of a
  running standard one (priority scheduling and the tier scheduler).

Every output line is parsed with the ``openai`` SDK's own models.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai.types
import openai.types.chat
import openai.types.responses
import orjson
import psutil
import pytest

from llmbatch.api.openai import BatchOutputLine
from llmbatch.api.shard import ShardSpec
from llmbatch.core.ids import batch_request_id, request_id
from llmbatch.core.keys import shard_cancel_key
from llmbatch.executor.engines import create_engine
from llmbatch.executor.engines.base import EngineRequest
from llmbatch.executor.engines.vllm import response_id
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.executor.main import run_shards
from llmbatch.executor.runner import Outcome, ShardRunner
from llmbatch.storage import FilesystemStore
from llmbatch.storage.shardresults import list_chunks, read_progress

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"


def _chat(cid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": CHAT,
        "body": {
            "model": "smollm2",
            "messages": [{"role": "user", "content": content}],
            "max_completion_tokens": 16,
            "temperature": 0,
            **extra,
        },
    }


def _completion(cid: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": COMPLETIONS,
        "body": {"model": "smollm2", "prompt": prompt, "max_tokens": 8, **extra},
    }


def _response(cid: str, input_: Any, **extra: Any) -> dict[str, Any]:
    body = {"model": "smollm2", "input": input_, "max_output_tokens": 12, "temperature": 0}
    return {"custom_id": cid, "method": "POST", "url": RESPONSES, "body": {**body, **extra}}


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _spec(root: Path, model: Path, key: str, endpoint: str, index: int, **extra: Any) -> ShardSpec:
    return ShardSpec.model_validate(
        {
            "batch_id": "batch_it",
            "batch_uid": "uid-it",
            "shard_index": index,
            "endpoint": endpoint,
            "store": f"file://{root}",
            "input_key": key,
            "output_prefix": f"uid-it/shards/{index:05d}",
            "model": {"name": "smollm2", "path": str(model)},
            "engine": {"name": "vllm", "args": {"max_num_seqs": 8}},
            "flush_lines": 4,
            "flush_seconds": 1.0,
            "retries": {"max_attempts": 3, "backoff_seconds": 0.01},
            **extra,
        }
    )


def _lines(root: Path, prefix: str, kind: str) -> list[dict[str, Any]]:
    store = FilesystemStore(root)
    out: list[dict[str, Any]] = []
    for key in list_chunks(store, prefix, kind):  # type: ignore[arg-type]
        out += [orjson.loads(raw) for raw in store.get(key).splitlines()]
    return out


# --- one in-process engine: chat + completions shards at once


@pytest.fixture(scope="module")
def smollm2_run(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, vllm_env: dict[str, str]
) -> tuple[Path, Outcome]:
    root = tmp_path_factory.mktemp("vllm-store")
    _write(
        root / "chat.jsonl",
        [
            _chat("capital", "What is the capital of France?"),
            _chat("seeded", "Say hello.", seed=1234, temperature=0.8),
            _chat("ticket", "Summarize: I cannot sign in."),
            _chat("toolong", "hello " * 3000),
            _chat("badparam", "hi", temperature=-1),
            _chat("wrongmodel", "hi", model="gpt-x"),
        ],
    )
    _write(
        root / "completions.jsonl",
        [
            _completion("c1", "The capital of France is"),
            _completion("c2", "One, two, three,"),
            _completion("cbad", "x", max_tokens=-5),
        ],
    )
    _write(
        root / "responses.jsonl",
        [
            _response("rtext", "What is the capital of France?", store=True),
            _response(
                "ritems",
                [{"role": "user", "content": "Count to three."}],
                instructions="Answer briefly.",
                request_id="mine",  # vLLM's extra field: replaced, the id is the line's own
            ),
            _response("rwrongmodel", "hi", model="gpt-x"),
        ],
    )
    for key, value in vllm_env.items():
        os.environ.setdefault(key, value)
    specs = [
        _spec(root, smollm2_path, "chat.jsonl", CHAT, 0),
        _spec(root, smollm2_path, "completions.jsonl", COMPLETIONS, 1),
        _spec(root, smollm2_path, "responses.jsonl", RESPONSES, 2),
    ]

    _write(
        root / "cancel.jsonl",
        [_chat(f"k{i}", f"Tell a story {i}.", max_tokens=48) for i in range(12)],
    )
    cancelled = _spec(
        root,
        smollm2_path,
        "cancel.jsonl",
        CHAT,
        3,
        max_in_flight=4,
        drain_seconds=0.05,
        cancel_drain_seconds=300,
    )

    async def go() -> Outcome:
        engine = create_engine(specs[0].engine, specs[0].model, specs[0].served_names())
        await engine.start()
        _record_engine_core(engine, root / "engine-core.json")
        try:
            store = FilesystemStore(root)
            outcome, _ = await run_shards(
                specs, engine, [(store, store)] * len(specs), handle_signals=False
            )
            await _cancel_mid_run(cancelled, engine, store, root / "cancel-run.json")
        finally:
            await engine.close()
        return outcome

    return root, asyncio.run(go())


async def _cancel_mid_run(spec: ShardSpec, engine: Any, store: FilesystemStore, out: Path) -> None:
    """Take a cancelled batch's shard back while four requests are in the engine (its cancel
    mark written first, as the operator does); record what the run had in flight then."""
    store.put(shard_cancel_key(spec.output_prefix), b"{}")
    runner = ShardRunner(spec, engine, store)
    task = asyncio.create_task(runner.run())
    while runner.stats.in_flight < 4 and not task.done():
        await asyncio.sleep(0.01)
    in_flight, done_before = runner.stats.in_flight, runner.stats.completed
    runner.request_stop(taken_back=True)
    outcome = await task
    out.write_text(
        json.dumps({"in_flight": in_flight, "done_before": done_before, "outcome": outcome.value})
    )


def _record_engine_core(engine: Any, path: Path) -> None:
    """What the running engine's core process is (vLLM's own handle on it): its parent's
    command line and the shared libraries it has loaded."""
    manager = engine._client.engine_core.resources.engine_manager
    [handle] = manager.processes
    core = psutil.Process(handle.pid)
    parent = core.parent()
    assert parent is not None
    path.write_text(
        json.dumps(
            {
                "parent": parent.cmdline(),
                "parent_is_us": parent.pid == os.getpid(),
                "libraries": sorted({m.path for m in core.memory_maps() if ".so" in m.path}),
            }
        )
    )


def test_the_engine_core_is_forked_from_the_preloaded_server(
    smollm2_run: tuple[Path, Outcome],
) -> None:
    """vLLM's CPU platform would spawn the engine core, which then imports torch and vLLM again
    after us: it is forked from the forkserver that imported them meanwhile, and it runs on
    torch's libgomp. (torch links libgomp itself, so that last check shows the outcome, not the
    preload: the preload rule is checked in test_vllm_core_server.py.)"""
    root, _ = smollm2_run
    core = json.loads((root / "engine-core.json").read_text())
    assert not core["parent_is_us"]
    assert "multiprocessing.forkserver" in " ".join(core["parent"])
    assert any(Path(lib).name.startswith("libgomp") for lib in core["libraries"])


def test_chat_lines_parse_with_the_sdk(smollm2_run: tuple[Path, Outcome]) -> None:
    root, outcome = smollm2_run
    assert outcome is Outcome.DONE
    lines = {line["custom_id"]: line for line in _lines(root, "uid-it/shards/00000", "output")}
    assert set(lines) == {"capital", "seeded", "ticket"}
    for cid, line in lines.items():
        parsed = BatchOutputLine.model_validate(line)
        assert parsed.id == batch_request_id("uid-it", cid)
        assert parsed.response is not None
        assert parsed.response.request_id == request_id("uid-it", cid)
        assert parsed.response.status_code == 200
        assert parsed.error is None
        completion = openai.types.chat.ChatCompletion.model_validate(parsed.response.body)
        assert completion.model == "smollm2"
        assert completion.usage is not None
        assert completion.usage.completion_tokens > 0
    answer = lines["capital"]["response"]["body"]["choices"][0]["message"]["content"]
    assert "Paris" in answer


def test_engine_rejections_are_error_lines(smollm2_run: tuple[Path, Outcome]) -> None:
    root, _ = smollm2_run
    errors = {line["custom_id"]: line for line in _lines(root, "uid-it/shards/00000", "errors")}
    assert set(errors) == {"toolong", "badparam", "wrongmodel"}
    for line in errors.values():
        assert line["error"] is None
        assert line["response"]["status_code"] >= 400
        body = line["response"]["body"]["error"]
        assert body["message"]
        assert body["type"] == "invalid_request_error"
    assert errors["toolong"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    assert errors["wrongmodel"]["response"]["status_code"] == 404
    # the caller's own errors, as vLLM answers them, are final at once: no attempt note
    assert all("attempt" not in e["response"]["body"]["error"]["message"] for e in errors.values())


def test_a_cancelled_shards_requests_in_the_engine_finish(
    smollm2_run: tuple[Path, Outcome],
) -> None:
    # taken back with four requests of 48 tokens in the engine and a take-back drain of 0.05 s:
    # the cancel mark lets them finish; nothing new was started
    root, _ = smollm2_run
    run = json.loads((root / "cancel-run.json").read_text())
    assert run == {"in_flight": 4, "done_before": 0, "outcome": "preempted"}
    lines = _lines(root, "uid-it/shards/00003", "output")
    assert len(lines) == 4
    for line in lines:
        parsed = BatchOutputLine.model_validate(line)
        assert parsed.response is not None
        openai.types.chat.ChatCompletion.model_validate(parsed.response.body)
    assert _lines(root, "uid-it/shards/00003", "errors") == []


def test_completions_parse_with_the_sdk(smollm2_run: tuple[Path, Outcome]) -> None:
    root, _ = smollm2_run
    prefix = "uid-it/shards/00001"
    lines = {line["custom_id"]: line for line in _lines(root, prefix, "output")}
    assert set(lines) == {"c1", "c2"}
    for line in lines.values():
        completion = openai.types.Completion.model_validate(line["response"]["body"])
        assert completion.choices[0].text
    assert [line["custom_id"] for line in _lines(root, prefix, "errors")] == ["cbad"]
    progress = read_progress(FilesystemStore(root), prefix)
    assert progress is not None
    assert progress.done
    assert (progress.completed, progress.failed) == (2, 1)
    assert progress.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in lines.values()
    )


def test_responses_parse_with_the_sdk(smollm2_run: tuple[Path, Outcome]) -> None:
    """Served by vLLM's own Responses layer: every body is the SDK's ``Response``, its usage is
    what the progress record counts, its id is stable for the line."""
    root, _ = smollm2_run
    prefix = "uid-it/shards/00002"
    lines = {line["custom_id"]: line for line in _lines(root, prefix, "output")}
    assert set(lines) == {"rtext", "ritems"}
    outputs = 0
    for cid, line in lines.items():
        parsed = BatchOutputLine.model_validate(line)
        assert parsed.response is not None
        assert parsed.response.status_code == 200
        response = openai.types.responses.Response.model_validate(parsed.response.body)
        assert response.id == response_id(request_id("uid-it", cid))
        assert response.object == "response"
        assert response.model == "smollm2"
        assert response.status in ("completed", "incomplete")
        assert response.output_text
        assert response.usage is not None
        assert response.usage.input_tokens > 0
        assert 0 < response.usage.output_tokens <= 12
        assert response.usage.total_tokens == (
            response.usage.input_tokens + response.usage.output_tokens
        )
        outputs += response.usage.output_tokens
    assert (
        "Paris"
        in openai.types.responses.Response.model_validate(
            lines["rtext"]["response"]["body"]
        ).output_text
    )
    (error,) = _lines(root, prefix, "errors")
    assert (error["custom_id"], error["response"]["status_code"]) == ("rwrongmodel", 404)
    progress = read_progress(FilesystemStore(root), prefix)
    assert progress is not None
    assert (progress.done, progress.completed, progress.failed) == (True, 2, 1)
    assert progress.output_tokens == outputs


# --- executor processes: SIGTERM, SIGKILL, resume


def _executor(
    spec: ShardSpec, term_log: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmbatch.executor",
            "--shard-spec",
            spec.model_dump_json(),
            "--termination-log",
            str(term_log),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def _wait_for_completed(
    root: Path, prefix: str, at_least: int, proc: subprocess.Popen[bytes]
) -> int:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, "executor exited early"
        progress = read_progress(FilesystemStore(root), prefix)
        if progress is not None and progress.completed >= at_least:
            return progress.completed
        time.sleep(0.2)
    raise AssertionError("no progress within 300 s")


def test_sigterm_then_sigkill_then_resume(
    tmp_path: Path, smollm2_path: Path, vllm_env: dict[str, str]
) -> None:
    n = 48
    rows = [_chat(f"q{i:03d}", f"Count from {i} to {i + 20}.") for i in range(n)]
    for row in rows:
        row["body"]["max_completion_tokens"] = 48
    _write(tmp_path / "in.jsonl", rows)
    spec = _spec(tmp_path, smollm2_path, "in.jsonl", CHAT, 0, drain_seconds=1.0)
    prefix = spec.output_prefix
    term = tmp_path / "termination-log"
    log = tmp_path / "executor.log"

    # 1. SIGTERM mid-shard: distinct exit code, finished results committed
    proc = _executor(spec, term, vllm_env, log)
    _wait_for_completed(tmp_path, prefix, 4, proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == ExitCode.PREEMPTED, log.read_text()[-3000:]
    assert term.read_text().startswith("PREEMPTED")
    after_term = _lines(tmp_path, prefix, "output")
    progress = read_progress(FilesystemStore(tmp_path), prefix)
    assert progress is not None
    assert progress.state == "preempted"
    assert progress.completed == len(after_term) >= 4

    # 2. the retry is killed outright once it has committed more
    proc = _executor(spec, term, vllm_env, log)
    _wait_for_completed(tmp_path, prefix, len(after_term) + 4, proc)
    family = psutil.Process(proc.pid).children(recursive=True)  # its engine core
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()

    # 3. the last run finishes the shard: one line per custom_id, earlier results kept
    proc = _executor(spec, term, vllm_env, log)
    assert proc.wait(timeout=600) == ExitCode.DONE, log.read_text()[-3000:]
    lines = _lines(tmp_path, prefix, "output") + _lines(tmp_path, prefix, "errors")
    ids = [line["custom_id"] for line in lines]
    assert sorted(ids) == sorted(row["custom_id"] for row in rows)
    kept = {line["custom_id"]: line for line in _lines(tmp_path, prefix, "output")}
    for line in after_term:
        assert kept[line["custom_id"]] == line
    progress = read_progress(FilesystemStore(tmp_path), prefix)
    assert progress is not None
    assert progress.done
    assert progress.attempts == 3


def test_engine_death_is_a_shard_failure(
    tmp_path: Path, smollm2_path: Path, vllm_env: dict[str, str]
) -> None:
    """vLLM CPU bug: a per-request seed under chunked prefill kills the engine core. `vllm
    run-batch` then writes a 500 for every row and exits 0; the executor exits 70 and says why."""
    rows = [_chat(f"ok{i}", "Say hi.") for i in range(3)]
    rows.append(_chat("seeded", "Tell me about Paris. " * 40, seed=7, temperature=0.7))
    _write(tmp_path / "in.jsonl", rows)
    spec = _spec(tmp_path, smollm2_path, "in.jsonl", CHAT, 0)
    spec.engine.args.update({"enable_chunked_prefill": True, "max_num_batched_tokens": 64})
    term = tmp_path / "termination-log"
    log = tmp_path / "executor.log"
    proc = _executor(spec, term, vllm_env, log)
    code = proc.wait(timeout=600)
    assert code == ExitCode.ENGINE_FAILED, log.read_text()[-3000:]
    assert term.read_text().startswith("ENGINE_FAILED")
    lines = _lines(tmp_path, spec.output_prefix, "output")
    lines += _lines(tmp_path, spec.output_prefix, "errors")
    assert all(line["response"]["status_code"] < 500 for line in lines)
    progress = read_progress(FilesystemStore(tmp_path), spec.output_prefix)
    assert progress is not None
    assert progress.state == "engine_failed"


# --- a pinned revision in a Hugging Face cache: the engine loads that snapshot


def _cache_repo(root: Path, smollm2: Path) -> tuple[Path, str, str]:
    """``models--llmbatch--smollm2`` with two snapshots of SmolLM2 (the weights linked): ``v1``
    as prepared, and ``main`` whose chat template has a longer system prompt (so the same row
    has more prompt tokens). Returns the repository and the two commits."""
    repo = root / "hub" / "models--llmbatch--smollm2"
    commits = {"v1": "1" * 40, "main": "2" * 40}
    for ref, commit in commits.items():
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for item in smollm2.iterdir():
            (snapshot / item.name).symlink_to(item)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    template = repo / "snapshots" / commits["main"] / "chat_template.jinja"
    text = template.read_text()
    template.unlink()
    longer = "You are a careful assistant who always answers in one short and polite sentence"
    template.write_text(text.replace("You are a helpful AI assistant named SmolLM", longer))
    return repo, commits["v1"], commits["main"]


def test_a_pinned_revision_loads_its_snapshot_of_a_hugging_face_cache(
    tmp_path: Path, smollm2_path: Path, vllm_env: dict[str, str]
) -> None:
    """#32 item 1: the revision reaches the engine. The same row, run pinned to ``v1`` and to
    ``main`` of one cache repository, is answered by the two snapshots (their chat templates
    differ: so do the prompt tokens); a revision the cache does not hold never starts."""
    repo, v1, main = _cache_repo(tmp_path, smollm2_path)
    _write(tmp_path / "in.jsonl", [_chat("q", "Name a colour.")])
    prompt_tokens: dict[str, int] = {}
    for index, revision in enumerate(("v1", main[:7])):
        spec = _spec(tmp_path, repo, "in.jsonl", CHAT, index)
        spec.model.revision = revision
        log = tmp_path / f"executor-{index}.log"
        proc = _executor(spec, tmp_path / "termination-log", vllm_env, log)
        assert proc.wait(timeout=600) == ExitCode.DONE, log.read_text()[-3000:]
        commit = v1 if revision == "v1" else main
        assert f"weights {repo / 'snapshots' / commit} (revision {commit})" in log.read_text()
        (line,) = _lines(tmp_path, spec.output_prefix, "output")
        prompt_tokens[revision] = line["response"]["body"]["usage"]["prompt_tokens"]
    assert prompt_tokens[main[:7]] > prompt_tokens["v1"], prompt_tokens

    spec = _spec(tmp_path, repo, "in.jsonl", CHAT, 9)
    spec.model.revision = "v9"
    log = tmp_path / "executor-v9.log"
    proc = _executor(spec, tmp_path / "termination-log", vllm_env, log)
    assert proc.wait(timeout=300) != ExitCode.DONE
    assert "revision 'v9' is not in the model cache" in log.read_text(), log.read_text()[-3000:]
    assert _lines(tmp_path, spec.output_prefix, "output") == []


# --- embeddings through `llmbatch run`


def test_llmbatch_run_embeddings_with_minilm(
    tmp_path: Path, minilm_path: Path, vllm_env: dict[str, str]
) -> None:
    rows = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "minilm", "input": text},
        }
        for i, text in enumerate(["a cat", "a dog", ["one", "two"]])
    ]
    requests = tmp_path / "emb.jsonl"
    _write(requests, rows)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "llmbatch"),
            "run",
            str(requests),
            "-o",
            str(out),
            "-e",
            str(err),
            "--model",
            "minilm",
            "--no-progress",
        ],
        env=vllm_env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = [json.loads(raw) for raw in out.read_text().splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["e0", "e1", "e2"]
    assert err.read_text() == ""
    for line in lines:
        body = openai.types.CreateEmbeddingResponse.model_validate(line["response"]["body"])
        assert all(len(item.embedding) == 384 for item in body.data)
        assert len(body.data) == (2 if line["custom_id"] == "e2" else 1)


def _vllm_counter(name: str) -> float:
    """A vLLM metric of this process's engine, summed over its label sets (vLLM registers its
    Prometheus metrics in the default registry)."""
    import prometheus_client

    return sum(
        sample.value
        for metric in prometheus_client.REGISTRY.collect()
        for sample in metric.samples
        if sample.name == name
    )


def test_expedited_requests_take_the_seat_of_a_running_standard_one(
    smollm2_path: Path, vllm_env: dict[str, str]
) -> None:
    """The executor starts vLLM with priority scheduling and its tier scheduler, and sends each
    request with its shard's tier rank. On an engine running one request at a time, s0 (seeded
    sampling) is running when two expedited requests arrive: vLLM preempts it for them (its own
    preemption counter), they are answered first, then s0 — once, whole — then the standard
    ones queued behind it."""
    for key, value in vllm_env.items():
        os.environ.setdefault(key, value)
    spec = _spec(smollm2_path.parent, smollm2_path, "unused.jsonl", CHAT, 0)
    engine = create_engine(
        spec.engine.model_copy(update={"args": {"max_num_seqs": 1}}),
        spec.model,
        spec.served_names(),
    )
    done: list[str] = []
    tokens: dict[str, int] = {}

    async def ask(cid: str, tier_rank: int, **extra: Any) -> None:
        # min_tokens / ignore_eos (vLLM extensions): every answer takes the same 24 steps
        row = _chat(
            cid,
            "Count to fifty.",
            max_completion_tokens=24,
            min_tokens=24,
            ignore_eos=True,
            **extra,
        )
        result = await engine.handle(
            EngineRequest(cid, CHAT, row["body"], request_id("b", cid), tier_rank)
        )
        assert result.ok, result.body
        done.append(cid)
        tokens[cid] = result.body["usage"]["completion_tokens"]

    async def go() -> float:
        await engine.start()
        try:
            first = asyncio.ensure_future(ask("s0", 1, seed=7, temperature=1.0))
            deadline = time.monotonic() + 60
            while _vllm_counter("vllm:num_requests_running") < 1:  # s0 holds the one seat
                assert time.monotonic() < deadline, "s0 never ran"
                await asyncio.sleep(0.05)
            preempted_before = _vllm_counter("vllm:num_preemptions_total")
            standard = [asyncio.ensure_future(ask(f"s{i}", 1)) for i in range(1, 4)]
            await asyncio.sleep(0.2)  # queued behind s0
            expedited = [asyncio.ensure_future(ask(f"e{i}", 0)) for i in range(2)]
            await asyncio.gather(first, *standard, *expedited)
            return _vllm_counter("vllm:num_preemptions_total") - preempted_before
        finally:
            await engine.close()

    preemptions = asyncio.run(go())
    assert done == ["e0", "e1", "s0", "s1", "s2", "s3"], done
    assert preemptions >= 1
    assert set(tokens.values()) == {24}, tokens
