#!/usr/bin/env python3
"""Executor peak RSS must not grow with input size: 1,000 vs 50,000 requests, simulated engine.

Each size runs ``python -m llmbatch.executor`` as a fresh process on a filesystem store; its peak
RSS comes from ``wait4``'s rusage. Prints both, their ratio, and the request rate.

    .venv/bin/python benchmarks/bench_executor_memory.py [--small 1000] [--large 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import orjson


def make_input(path: pathlib.Path, n: int) -> None:
    with path.open("wb") as handle:
        for i in range(n):
            row = {
                "custom_id": f"request-{i:07d}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": "sim",
                    "messages": [{"role": "user", "content": f"Summarize ticket {i}. " * 20}],
                    "max_completion_tokens": 16,
                },
            }
            handle.write(orjson.dumps(row) + b"\n")


def run(n: int) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory(prefix="bench-exec-mem-") as tmp:
        root = pathlib.Path(tmp)
        make_input(root / "in.jsonl", n)
        spec = {
            "batch_id": "batch_bench",
            "batch_uid": "bench",
            "endpoint": "/v1/chat/completions",
            "store": f"file://{root}",
            "input_key": "in.jsonl",
            "output_prefix": "bench/shards/00000",
            "model": {"name": "sim", "path": "/none"},
            "engine": {"name": "simulated", "args": {"max_num_seqs": 64}},
            "flush_lines": 1000,
        }
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "llmbatch.executor", "--shard-spec", json.dumps(spec)],
            stderr=subprocess.DEVNULL,
            env={**os.environ, "LLMBATCH_TERMINATION_LOG": str(root / "term")},
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        elapsed = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"executor exited {proc.returncode} for n={n}")
        progress = json.loads((root / "bench/shards/00000/progress.json").read_text())
        assert progress["completed"] == n, progress
        return usage.ru_maxrss / 1024, elapsed, (root / "in.jsonl").stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=50_000)
    opts = parser.parse_args()
    rows = []
    for n in (opts.small, opts.large):
        rss, elapsed, size = run(n)
        rows.append((n, rss, elapsed, size))
        print(
            f"{n:>7} requests ({size / 1e6:6.1f} MB): peak RSS {rss:6.1f} MiB, "
            f"{elapsed:5.1f} s, {n / elapsed:7.0f} req/s",
            flush=True,
        )
    ratio = rows[1][1] / rows[0][1]
    print(f"peak RSS ratio large/small: {ratio:.2f}x for {opts.large / opts.small:.0f}x the input")


if __name__ == "__main__":
    main()
