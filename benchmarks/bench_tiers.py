#!/usr/bin/env python3
"""Tiers inside one engine: the executor's tier scheduler against vLLM's own priority scheduler.

One SmolLM2 CPU engine per side, each in a fresh process, with the executor's engine defaults
(``scheduling_policy: priority``, ``max_num_seqs`` 32); the only difference is ``scheduler_cls``:
``tier`` is the executor's default (``engines/tiersched.py``: a waiting request of a better
priority takes the seat of a running worse one), ``vllm`` is vLLM's ``Scheduler`` (a better
request waits for a running one to finish). Each repetition times ``--expedited`` expedited
requests (priority 0) alone, then again while a standard stream (priority 1) keeps 64 requests of
``--standard-tokens`` output tokens in the engine, as a standard shard on a warm slot does.
Printed: medians of the expedited time alone, beside the stream, their ratio, and vLLM's
preemption count, side by side.

    .venv/bin/python benchmarks/bench_tiers.py [--reps 5] [--standard-tokens 64]

Needs ``make vllm models``; run it on an idle machine (it measures wall time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

SCHEDULERS = {"tier": None, "vllm": "vllm.v1.core.sched.scheduler.Scheduler"}


def _request(tag: str, j: int, priority: int, tokens: int) -> Any:
    from llmbatch.executor.engines.base import EngineRequest

    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": f"Say something about the number {j}."}],
        "max_tokens": tokens,
        "min_tokens": tokens,  # vLLM extensions: every answer has the same length
        "ignore_eos": True,
    }
    rid = f"req_{tag}{j}_{time.monotonic_ns()}"
    return EngineRequest(f"{tag}{j}", "/v1/chat/completions", body, rid, priority)


def _preemptions() -> float:
    import prometheus_client

    return sum(
        sample.value
        for metric in prometheus_client.REGISTRY.collect()
        for sample in metric.samples
        if sample.name == "vllm:num_preemptions_total"
    )


async def _side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    from llmbatch.api.shard import ModelRef
    from llmbatch.executor.engines.vllm import VllmEngine
    from llmbatch.executor.models import resolve

    path, _ = resolve("smollm2")
    engine_args = {} if SCHEDULERS[side] is None else {"scheduler_cls": SCHEDULERS[side]}
    engine = VllmEngine(engine_args, ModelRef(name="smollm2", path=str(path)), ["smollm2"])
    await engine.start()

    async def expedited() -> float:
        started = time.monotonic()
        await asyncio.gather(
            *(engine.handle(_request("e", j, 0, args.tokens)) for j in range(args.expedited))
        )
        return time.monotonic() - started

    async def stream(stop: asyncio.Event) -> None:
        live: set[asyncio.Task[Any]] = set()
        j = 0
        while not stop.is_set():
            while len(live) < 2 * engine.max_num_seqs:
                task = asyncio.ensure_future(
                    engine.handle(_request("s", j, 1, args.standard_tokens))
                )
                live.add(task)
                task.add_done_callback(live.discard)
                j += 1
            await asyncio.sleep(0.02)
        await asyncio.gather(*live)

    alone: list[float] = []
    beside: list[float] = []
    preempted: list[float] = []
    try:
        await expedited()  # warm-up
        for _ in range(args.reps):
            alone.append(await expedited())
            stop = asyncio.Event()
            feeder = asyncio.ensure_future(stream(stop))
            await asyncio.sleep(args.settle)  # the engine is full of standard requests
            before = _preemptions()
            beside.append(await expedited())
            stop.set()
            await feeder
            # read once the stream is done: vLLM's metrics follow its outputs with a lag, and no
            # preemption follows the expedited requests (nothing better is waiting then)
            preempted.append(_preemptions() - before)
    finally:
        await engine.close()
    return {"alone": alone, "beside": beside, "preemptions": preempted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--expedited", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=16, help="output tokens, expedited")
    parser.add_argument("--standard-tokens", type=int, default=64, help="output tokens, standard")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds of stream first")
    parser.add_argument("--side", choices=sorted(SCHEDULERS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(asyncio.run(_side(args.side, args))))
        return
    env = {"VLLM_LOGGING_LEVEL": "WARNING", **os.environ}
    results: dict[str, dict[str, Any]] = {}
    for side in SCHEDULERS:
        proc = subprocess.run(
            [sys.executable, __file__, "--side", side, *sys.argv[1:]],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"{side}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"{args.expedited} expedited requests ({args.tokens} tokens) alone, then beside a "
        f"standard stream of {args.standard_tokens}-token requests; median of {args.reps}"
    )
    print(f"{'':34}{'tier (ours)':>14}{'vllm':>14}")
    rows = [
        ("expedited alone (s)", lambda r: statistics.median(r["alone"])),
        ("expedited beside the stream (s)", lambda r: statistics.median(r["beside"])),
        (
            "beside / alone",
            lambda r: statistics.median(
                b / a for a, b in zip(r["alone"], r["beside"], strict=True)
            ),
        ),
        ("vLLM preemptions meanwhile", lambda r: statistics.median(r["preemptions"])),
    ]
    for label, value in rows:
        print(f"{label:34}" + "".join(f"{value(results[s]):>14.2f}" for s in SCHEDULERS))


if __name__ == "__main__":
    main()
