"""``python -m llmbatch.executor`` as a process: exit codes, termination log, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from llmbatch.executor.exitcodes import ExitCode
from llmbatch.storage import FilesystemStore
from llmbatch.storage.shardresults import list_chunks, read_progress

PREFIX = "u1/shards/00000"


def _write_input(root: Path, n: int) -> None:
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        }
        for i in range(n)
    ]
    (root / "in.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


def _spec(root: Path, **engine_args: Any) -> dict[str, Any]:
    return {
        "batch_id": "batch_1",
        "batch_uid": "u1",
        "endpoint": "/v1/chat/completions",
        "store": f"file://{root}",
        "input_key": "in.jsonl",
        "output_prefix": PREFIX,
        "model": {"name": "m", "path": "/nowhere"},
        "engine": {"name": "simulated", "args": engine_args},
        "flush_lines": 5,
        "flush_seconds": 0.2,
        "drain_seconds": 2.0,
    }


def _start(tmp_path: Path, spec: dict[str, Any] | str) -> subprocess.Popen[bytes]:
    spec_arg = spec if isinstance(spec, str) else json.dumps(spec)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llmbatch.executor",
            "--shard-spec",
            spec_arg,
            "--termination-log",
            str(tmp_path / "termination-log"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _ids(root: Path) -> list[str]:
    store = FilesystemStore(root)
    ids = []
    for kind in ("output", "errors"):
        for key in list_chunks(store, PREFIX, kind):  # type: ignore[arg-type]
            ids += [orjson.loads(raw)["custom_id"] for raw in store.get(key).splitlines()]
    return ids


def test_done_exits_zero_from_a_spec_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    _write_input(store, 20)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(_spec(store)))
    proc = _start(tmp_path, str(spec_file))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.DONE, out.decode()
    assert sorted(_ids(store)) == sorted(f"r{i}" for i in range(20))
    assert not (tmp_path / "termination-log").exists()


def test_bad_config_exit_code(tmp_path: Path) -> None:
    proc = _start(tmp_path, '{"batch_id": "x"}')
    proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.BAD_CONFIG == 78
    assert "BAD_CONFIG" in (tmp_path / "termination-log").read_text()

    store = tmp_path / "store"
    store.mkdir()
    proc = _start(tmp_path, _spec(store))  # no input object
    proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.BAD_CONFIG
    assert "input object not found" in (tmp_path / "termination-log").read_text()


def test_sigterm_commits_finished_results_and_exits_75(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    _write_input(store, 2000)
    proc = _start(tmp_path, _spec(store, latency_seconds=0.05, max_num_seqs=4))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        progress = read_progress(FilesystemStore(store), PREFIX)
        if progress is not None and progress.completed >= 20:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.PREEMPTED == 75, out.decode()
    assert "PREEMPTED" in (tmp_path / "termination-log").read_text()
    ids = _ids(store)
    assert len(ids) == len(set(ids))
    assert 20 <= len(ids) < 2000
    progress = read_progress(FilesystemStore(store), PREFIX)
    assert progress is not None
    assert progress.state == "preempted"
    assert progress.completed == len(ids)

    # the retry resumes: exactly one line per custom_id in the end
    proc = _start(tmp_path, _spec(store))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.DONE, out.decode()
    ids = _ids(store)
    assert sorted(ids) == sorted(f"r{i}" for i in range(2000))


def test_engine_death_exits_70_with_a_reason(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    _write_input(store, 30)
    proc = _start(tmp_path, _spec(store, die_after=10, max_num_seqs=1))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.ENGINE_FAILED == 70, out.decode()
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith("ENGINE_FAILED")
    assert "death" in message
    assert len(_ids(store)) == 10


def test_termination_log_env_override(tmp_path: Path) -> None:
    target = tmp_path / "from-env"
    proc = subprocess.run(
        [sys.executable, "-m", "llmbatch.executor", "--shard-spec", "/does/not/exist"],
        env={**os.environ, "LLMBATCH_TERMINATION_LOG": str(target)},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == ExitCode.BAD_CONFIG
    assert "shard spec not found" in target.read_text()


def test_an_unreachable_store_is_a_retryable_exit_not_bad_config(tmp_path: Path) -> None:
    # Found by the fault sweep: the shard spec read from a store that is down ended the run
    # BAD_CONFIG (a FailJob exit), so an outage of a few seconds failed whole shards.
    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    uri = (
        f"s3://bucket?endpoint_url=http://127.0.0.1:{port}&region=us-east-1&path_style=true"
        "&max_attempts=1&connect_timeout=1"
    )
    env_keys = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}
    os.environ.update(env_keys)
    try:
        proc = _start(tmp_path, f"{uri}#work/spec.json")
        out, _ = proc.communicate(timeout=60)
    finally:
        for key in env_keys:
            os.environ.pop(key, None)
    assert proc.returncode == ExitCode.STORE_FAILED == 74, out.decode()
    assert "STORE_FAILED" in (tmp_path / "termination-log").read_text()
