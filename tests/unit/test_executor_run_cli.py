"""``llmbatch run`` on the simulated engine: validation first, shards, merged OpenAI files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import orjson
from click.testing import CliRunner

from llmbatch.cli import main
from llmbatch.core.ids import batch_request_id


def _write(path: Path, n: int, *, bad_line: bool = False) -> None:
    rows = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "sim",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "max_completion_tokens": 4,
            },
        }
        for i in range(n)
    ]
    lines = [orjson.dumps(r).decode() for r in rows]
    if bad_line:
        lines.insert(2, '{"custom_id": "x"')
    path.write_text("\n".join(lines) + "\n")


def test_run_with_shards_merges_every_result(tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    _write(requests, 25)
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(requests),
            "--engine",
            "simulated",
            "--model",
            "sim",
            "--shards",
            "3",
            "--engine-arg",
            "fail_pattern=^r7$",
            "--engine-arg",
            "fail_status=400",
            "--work-dir",
            str(tmp_path / "work"),
            "--print-results",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    output = [json.loads(x) for x in (tmp_path / "requests.output.jsonl").read_text().splitlines()]
    errors = [json.loads(x) for x in (tmp_path / "requests.errors.jsonl").read_text().splitlines()]
    assert sorted(x["custom_id"] for x in output) == sorted(f"r{i}" for i in range(25) if i != 7)
    assert [x["custom_id"] for x in errors] == ["r7"]
    assert errors[0]["response"]["status_code"] == 400
    uid = output[0]["id"]
    assert uid.startswith("batch_req_")
    assert "r3: " in result.output
    shard_dirs = list((tmp_path / "work").glob("local-*/shards/*"))
    assert len(shard_dirs) == 3

    # same input, same ids; a rerun in the same work dir resumes (nothing left to do)
    args = ["run", str(requests), "--engine", "simulated", "--model", "sim", "--shards", "3"]
    args += ["--work-dir", str(tmp_path / "work"), "-o", str(tmp_path / "again.jsonl")]
    args += ["-e", str(tmp_path / "again-errors.jsonl"), "--no-progress"]
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    rerun = [json.loads(x) for x in (tmp_path / "again.jsonl").read_text().splitlines()]
    assert sorted(x["id"] for x in rerun) == sorted(x["id"] for x in output)
    batch_uid = "local-" + hashlib.sha256(requests.read_bytes()).hexdigest()[:32]
    assert batch_request_id(batch_uid, "r0") in {x["id"] for x in output}


def test_invalid_file_runs_nothing(tmp_path: Path) -> None:
    requests = tmp_path / "bad.jsonl"
    _write(requests, 5, bad_line=True)
    result = CliRunner().invoke(
        main, ["run", str(requests), "--engine", "simulated", "--model", "sim", "--no-progress"]
    )
    assert result.exit_code == 1
    assert "line 3" in result.output
    assert not (tmp_path / "bad.output.jsonl").exists()


def test_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    requests = tmp_path / "r.jsonl"
    _write(requests, 2)
    result = CliRunner().invoke(main, ["run", str(requests), "--model", "no-such-model"])
    assert result.exit_code != 0
    assert "unknown model" in result.output
