#!/usr/bin/env python3
"""Validator throughput vs a bare ``orjson.loads``-per-line loop over the same file.

Generates a 200 MB / 50,000-line chat file (cached in benchmarks/.data), then, median of 5 runs,
prints our streaming validator's MB/s, the bare parse loop's MB/s, their ratio, and the validator's
peak RSS on that file and on a file a tenth the size (each measured in a fresh child process).

    .venv/bin/python benchmarks/bench_validate.py [--runs 5] [--lines 50000] [--mb 200] [--parts]

``--parts`` gives each user message's content as a list of one text part (the shape whose
every part the media allow-list checks) instead of a string.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import orjson

from llmbatch.core.validation import ValidationLimits, validate_stream

DATA = pathlib.Path(__file__).resolve().parent / ".data"
ENDPOINT = "/v1/chat/completions"
CHUNK = 1 << 20


def make_file(lines: int, total_mb: int, parts: bool = False) -> pathlib.Path:
    shape = "-parts" if parts else ""
    path = DATA / f"chat-{lines}-{total_mb}mb{shape}.jsonl"
    if path.exists():
        return path
    DATA.mkdir(parents=True, exist_ok=True)
    per_line = total_mb * 1_000_000 // lines
    skeleton = {
        "custom_id": "",
        "method": "POST",
        "url": ENDPOINT,
        "body": {
            "model": "smollm2",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": ""},
            ],
            "max_completion_tokens": 256,
            "temperature": 0.2,
        },
    }
    skeleton["custom_id"] = f"request-{lines}"
    overhead = len(json.dumps(skeleton)) + 1  # the longest custom_id, and the newline
    words = "the quick brown fox jumps over the lazy dog " * (per_line // 40 + 1)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for i in range(lines):
            skeleton["custom_id"] = f"request-{i}"
            text = words[: per_line - overhead - (28 if parts else 0)]
            content = [{"type": "text", "text": text}] if parts else text
            skeleton["body"]["messages"][1]["content"] = content  # type: ignore[index]
            out.write(json.dumps(skeleton) + "\n")
    tmp.rename(path)
    return path


def chunks(path: pathlib.Path):  # type: ignore[no-untyped-def]
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            yield chunk


def run_validator(path: pathlib.Path) -> float:
    start = time.perf_counter()
    result = validate_stream(chunks(path), endpoint=ENDPOINT, limits=ValidationLimits())
    elapsed = time.perf_counter() - start
    assert result.ok, result.errors[:3]
    return elapsed


def run_bare(path: pathlib.Path) -> float:
    start = time.perf_counter()
    with path.open("rb") as handle:
        for line in handle:
            orjson.loads(line)
    return time.perf_counter() - start


def peak_rss_mb(path: pathlib.Path) -> float:
    """Peak RSS of a fresh interpreter that imports the validator and validates ``path``."""
    code = (
        "import sys, resource;"
        "sys.argv=['x', sys.argv[1]];"
        "from benchmarks.bench_validate import run_validator;"
        "import pathlib; run_validator(pathlib.Path(sys.argv[1]))"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=DATA.parent.parent)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(before, after) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--parts", action="store_true", help="content as a list of text parts")
    args = parser.parse_args()
    path = make_file(args.lines, args.mb, args.parts)
    small = make_file(args.lines // 10, args.mb // 10, args.parts)
    size_mb = path.stat().st_size / 1e6
    ours, bare = [], []
    for _ in range(args.runs):  # interleaved so machine noise hits both alike
        ours.append(size_mb / run_validator(path))
        bare.append(size_mb / run_bare(path))
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    rss_small = peak_rss_mb(small)
    rss_big = peak_rss_mb(path)
    print(f"file: {path.name} ({size_mb:.0f} MB, {args.lines} lines), median of {args.runs}")
    print(f"validator            {statistics.median(ours):8.1f} MB/s")
    print(f"bare orjson loop     {statistics.median(bare):8.1f} MB/s")
    print(f"ratio (ours / bare)  {statistics.median(ratios):8.2f}   (target >= 0.5)")
    print(f"validator peak RSS   {rss_small:8.1f} MB on {small.stat().st_size / 1e6:.0f} MB file")
    print(f"validator peak RSS   {rss_big:8.1f} MB on {size_mb:.0f} MB file   (target < 150)")


if __name__ == "__main__":
    main()
