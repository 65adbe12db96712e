"""The executor against both store backends (filesystem and a real S3 server): a SIGKILLed run
and its retry leave exactly one result line per custom_id. Simulated engine: no model needed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from llmbatch.executor.exitcodes import ExitCode
from llmbatch.storage import open_store
from llmbatch.storage.base import ObjectInfo
from llmbatch.storage.s3 import S3Store
from llmbatch.storage.shardresults import ShardResults, list_chunks, read_progress, result_line
from tests.fixtures.s3server import S3Server

PREFIX = "work/u-store/shards/00003"


def _executor(spec: dict[str, object], tmp_path: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "llmbatch.executor", "--shard-spec", json.dumps(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "LLMBATCH_TERMINATION_LOG": str(tmp_path / "termination-log")},
    )


def test_sigkill_and_resume_on_each_backend(store_uri: str, tmp_path: Path) -> None:
    store = open_store(store_uri)
    n = 300
    rows = [
        {
            "custom_id": f"item-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "sim", "input": f"text {i}"},
        }
        for i in range(n)
    ]
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    header = b'{"custom_id": "skip-me", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'
    store.put("inputs/file-1.jsonl", header + data)
    spec = {
        "batch_id": "batch_store",
        "batch_uid": "u-store",
        "shard_index": 3,
        "endpoint": "/v1/embeddings",
        "store": store_uri,
        "input_key": "inputs/file-1.jsonl",
        "start": len(header),
        "first_line": 2,
        "output_prefix": PREFIX,
        "model": {"name": "sim", "path": "/none"},
        "engine": {"name": "simulated", "args": {"latency_seconds": 0.02, "max_num_seqs": 4}},
        "flush_lines": 10,
        "flush_seconds": 0.5,
    }
    proc = _executor(spec, tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = read_progress(store, PREFIX)
        if progress is not None and progress.completed >= 30:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert 30 <= progress.completed < n
    assert not progress.done

    spec["engine"] = {"name": "simulated", "args": {"max_num_seqs": 16}}
    proc = _executor(spec, tmp_path)
    assert proc.wait(timeout=120) == ExitCode.DONE
    ids: list[str] = []
    for key in list_chunks(store, PREFIX, "output"):
        ids += [orjson.loads(raw)["custom_id"] for raw in store.get(key).splitlines()]
    assert sorted(ids) == sorted(f"item-{i}" for i in range(n))
    assert list_chunks(store, PREFIX, "errors") == []
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.done
    assert progress.completed == n
    assert progress.attempts == 2


class _RacingS3Store(S3Store):
    """The real S3 store whose chunk-key ``head`` waits at a barrier: two writers both see a
    chunk number free before either writes — the race of two runners of one shard (a replaced
    pod still terminating) on a server without conditional writes."""

    barrier: threading.Barrier

    def head(self, key: str) -> ObjectInfo | None:
        found = super().head(key)
        if "/output-" in key:
            with contextlib.suppress(threading.BrokenBarrierError):
                self.barrier.wait(timeout=5)
        return found


def test_racing_writers_never_overwrite_a_chunk_without_conditional_writes(
    s3_server: S3Server, s3_bucket: str
) -> None:
    uri = s3_server.uri(s3_bucket, conditional_writes="emulate")
    config = open_store(uri)
    assert isinstance(config, S3Store)
    assert not config.atomic_if_absent()
    barrier = threading.Barrier(2)
    writers = []
    for name in ("a", "b"):
        store = _RacingS3Store(config.config)
        store.barrier = barrier
        results = ShardResults(store, PREFIX, batch_id="batch_x", shard_index=3)
        results.recover()
        results.add(
            result_line(
                line_id=f"batch_req_{name}",
                custom_id=f"req-{name}",
                status_code=200,
                request_id=f"req_{name}",
                body={"usage": {"prompt_tokens": 1, "completion_tokens": 1}},
            )
        )
        writers.append(results)
    threads = [threading.Thread(target=lambda r=r: r.commit(r.take_pending())) for r in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    keys = list_chunks(config, PREFIX, "output")
    assert len(keys) == 2, keys  # one chunk per writer: neither replaced the other
    found = sorted(
        orjson.loads(raw)["custom_id"] for key in keys for raw in config.get(key).splitlines()
    )
    assert found == ["req-a", "req-b"]
    # A third runner (the retry) reads both and skips both.
    third = ShardResults(config, PREFIX, batch_id="batch_x", shard_index=3)
    third.recover()
    assert third.done_ids == {"req-a", "req-b"}
