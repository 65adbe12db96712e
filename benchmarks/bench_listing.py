#!/usr/bin/env python3
"""One page of ``GET /v1/batches`` at 10,000 batches of one tenant: the listing index against
today's sort-and-scan.

Builds 10,000 Batch objects (status as the operator writes it), maps each once into a
:class:`~llmbatch.gateway.listindex.ListIndex`, then times pages after random cursors (and the
first page): ``page_after`` against sorting the same 10,000 mapped items and scanning them with
``paginate`` (what the route did per request, minus the API listing and the mapping it also did).
Both include the orjson encoding of the envelope. Prints p50/p99 per page, side by side, median
of ``--runs`` runs, and the index's memory per object (tracemalloc).

    .venv/bin/python benchmarks/bench_listing.py [--batches 10000] [--pages 500] [--runs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson

from llmbatch.gateway.listcache import batch_entry
from llmbatch.gateway.listindex import Entry, ListIndex
from llmbatch.gateway.mapping import ANNOTATION_CREATED_NS, list_envelope, paginate

NS = "team-bench"
BASE_NS = 1_795_000_000 * 10**9


def batch(n: int) -> dict[str, Any]:
    created = BASE_NS + n * 7_919_000_000  # ~8 s apart
    seconds = created // 10**9
    return {
        "metadata": {
            "name": f"batch-{n:024x}",
            "namespace": NS,
            "resourceVersion": str(1000 + n),
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)),
            "annotations": {ANNOTATION_CREATED_NS: str(created), "llmbatch.io/requests": "1000"},
        },
        "spec": {
            "endpoint": "/v1/chat/completions",
            "inputFileID": f"file-{n:032x}",
            "completionWindow": "24h",
            "priority": "standard",
            "metadata": {"job": f"nightly-{n % 97}", "owner": "bench"},
        },
        "status": {
            "status": "completed",
            "model": "smollm2",
            "createdAt": seconds,
            "inProgressAt": seconds + 5,
            "finalizingAt": seconds + 600,
            "completedAt": seconds + 610,
            "expiresAt": seconds + 86400,
            "outputFileID": f"file-{n + 1:032x}",
            "requestCounts": {"total": 1000, "completed": 998, "failed": 2},
            "usage": {"inputTokens": 120_000, "outputTokens": 64_000, "totalTokens": 184_000},
        },
    }


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(call: Callable[[str | None], bytes], cursors: list[str | None]) -> list[float]:
    out = []
    for after in cursors:
        start = time.perf_counter()
        call(after)
        out.append(time.perf_counter() - start)
    return out


def one_run(
    index: ListIndex, entries: list[Entry], cursors: list[str | None], limit: int
) -> tuple[float, float, float, float]:
    def indexed(after: str | None) -> bytes:
        page, more = index.page_after(NS, after, limit)
        return orjson.dumps(list_envelope(page, more))

    def scanned(after: str | None) -> bytes:
        # Per request before the index: every item of the tenant sorted, then scanned for the
        # cursor (the route also listed them from the API server and mapped the page).
        items = sorted(entries, key=lambda e: e.key, reverse=True)
        page, more = paginate(items, lambda e: e.id, after, limit)
        return orjson.dumps(list_envelope([e.data for e in page], more))

    assert indexed(cursors[1]) == scanned(cursors[1])  # the same answer, or the race is moot
    fast, slow = timed(indexed, cursors), timed(scanned, cursors)
    return (
        percentile(fast, 0.5),
        percentile(fast, 0.99),
        percentile(slow, 0.5),
        percentile(slow, 0.99),
    )


def build(count: int) -> tuple[ListIndex, list[Entry], float]:
    """The index of ``count`` batches (inserted in random order), and its bytes per object."""
    objects = [batch(n) for n in range(count)]
    random.shuffle(objects)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = ListIndex()
    entries = []
    for obj in objects:
        entry = batch_entry(obj)
        assert entry is not None
        index.put(NS, entry)
        entries.append(entry)
    per_object = (tracemalloc.get_traced_memory()[0] - before) / count
    tracemalloc.stop()
    return index, entries, per_object


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--pages", type=int, default=500, help="pages timed per run and limit")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    index, entries, per_object = build(args.batches)
    print(
        f"{args.batches} batches mapped and indexed in {time.perf_counter() - started:.2f} s; "
        f"~{per_object / 1024:.1f} KiB per object in the index (wire dict included)"
    )
    rng = random.Random(30)
    ids = [e.id for e in entries]
    cursors: list[str | None] = [None, *rng.choices(ids, k=args.pages - 1)]
    print(f"per page, median of {args.runs} runs of {args.pages} pages (ms):")
    print(f"{'limit':>5}  {'index p50':>10} {'index p99':>10}  {'scan p50':>10} {'scan p99':>10}")
    for limit in (20, 100):
        runs = [one_run(index, entries, cursors, limit) for _ in range(args.runs)]
        p50, p99, s50, s99 = (statistics.median(r[i] for r in runs) * 1000 for i in range(4))
        print(f"{limit:>5}  {p50:>10.3f} {p99:>10.3f}  {s50:>10.3f} {s99:>10.3f}")


if __name__ == "__main__":
    main()
