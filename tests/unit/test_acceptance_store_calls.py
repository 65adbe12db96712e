"""What accepting a batch costs in store calls (#30's burst: each call to a store thread waited
its turn on a busy event loop): the input stored and its model read in one call, each shard's
lease read and spec written in one, and no progress read for a shard never granted."""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Any

from tests.fixtures.builders import make_batch, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

NAME = "batch-" + "a" * 24


def test_accepting_an_inline_batch_reads_no_progress_and_writes_each_spec_once(
    tmp_path: pathlib.Path,
) -> None:
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool(shardRequests=2))
    requests = [
        {
            "customID": f"r{i}",
            "url": "/v1/chat/completions",
            "body": {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
        }
        for i in range(6)
    ]
    h.kube.add("batches", make_batch(NAME, requests=requests))
    calls: Counter[str] = Counter()
    for method in ("get", "head", "put", "iter_range"):
        original = getattr(h.store, method)

        def counted(key: str, *args: Any, _original: Any = original, _m: str = method) -> Any:
            calls[f"{_m} {key.rsplit('/', 1)[-1]}"] += 1
            return _original(key, *args)

        setattr(h.store, method, counted)
    h.step_until(NAME, "in_progress")
    status = h.status(NAME)
    assert [s["phase"] for s in status["shards"]] == ["Pending"] * 3
    assert not [c for c in calls if "progress" in c]
    assert sum(n for c, n in calls.items() if c.startswith("put") and "spec" in c) == 3
    # the inline input: written once, never read back to find its model
    inputs = {c: n for c, n in calls.items() if c.split(" ")[1].startswith("input")}
    assert sum(n for c, n in inputs.items() if c.startswith("put")) == 1, inputs
    assert sum(n for c, n in inputs.items() if c.startswith("iter_range")) == 1, inputs
