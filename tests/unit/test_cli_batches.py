"""The client commands' own logic: exit codes, progress lines and the estimate, failures grouped
by code, the output format, the endpoint and metadata of ``submit``, shell completion, and the
message when the ``[client]`` extra is missing. The verbs against a gateway:
tests/integration/test_client_cli.py."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from typing import Any

import click
import openai.types
import orjson
import pytest

from llmbatch.commands.batches.outcome import (
    ExitCode,
    Progress,
    duration,
    estimate,
    exit_code,
    summarize_failures,
)
from llmbatch.commands.batches.session import Format, batch_id, choose_format
from llmbatch.commands.batches.submit import endpoint_of, parse_metadata

NOW = 1_800_000_000


def sdk_batch(status: str, total: int, completed: int, failed: int, **extra: Any) -> Any:
    """A Batch as the SDK parses the gateway's answer (extra fields kept)."""
    return openai.types.Batch.model_validate(
        {
            "id": "batch_abc",
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "file-1",
            "completion_window": "24h",
            "status": status,
            "created_at": NOW - 125,
            "request_counts": {"total": total, "completed": completed, "failed": failed},
            **extra,
        }
    )


def test_exit_codes_tell_the_endings_apart() -> None:
    codes = {
        status: exit_code(status) for status in ("completed", "failed", "expired", "cancelled")
    }
    assert codes == {
        "completed": ExitCode.COMPLETED,
        "failed": ExitCode.FAILED,
        "expired": ExitCode.EXPIRED,
        "cancelled": ExitCode.CANCELLED,
    }
    assert len(set(codes.values()) | {ExitCode.ERROR, ExitCode.USAGE, ExitCode.INTERRUPTED}) == 7
    assert [int(c) for c in codes.values()] == [0, 3, 4, 5]


def test_a_progress_line_with_and_without_the_servers_estimate() -> None:
    running = Progress.of(sdk_batch("in_progress", 40, 11, 1))
    assert running.describe(NOW) == ("batch_abc in_progress, 12/40 done, 1 failed, 2m05s elapsed")
    estimated = Progress.of(sdk_batch("in_progress", 40, 11, 1, estimated_completion_at=NOW + 3725))
    assert estimated.describe(NOW).endswith(", done in ~1h02m05s")
    validating = Progress.of(sdk_batch("validating", 0, 0, 0))
    assert validating.total is None
    assert validating.counts() == "?/? done, 0 failed"
    ended = Progress.of(sdk_batch("completed", 2, 2, 0, estimated_completion_at=NOW + 60))
    assert ended.eta(NOW) == ""  # no estimate once it ended


@pytest.mark.parametrize("value", [None, "soon", True, 0, -5])
def test_an_unusable_estimate_is_none(value: object) -> None:
    assert estimate({"estimated_completion_at": value}) is None


def test_durations() -> None:
    assert [duration(s) for s in (0, 12, 185, 3725, -3)] == ["0s", "12s", "3m05s", "1h02m05s", "0s"]


def test_failures_grouped_by_code_most_frequent_first() -> None:
    lines = [
        {"custom_id": "a", "response": None,
         "error": {"code": "batch_expired", "message": "window passed"}},
        {"custom_id": "b", "error": None, "response": {"status_code": 400, "body": {
            "error": {"message": "too long", "type": "invalid_request_error",
                      "code": "context_length_exceeded"}}}},
        {"custom_id": "c", "response": None,
         "error": {"code": "batch_expired", "message": "window passed"}},
        {"custom_id": "d", "error": None, "response": {"status_code": 500, "body": {}}},
    ]  # fmt: skip
    groups = summarize_failures([orjson.dumps(line) + b"\n" for line in lines] + [b"\n"])
    assert [(g.code, g.count, g.example_custom_id) for g in groups] == [
        ("batch_expired", 2, "a"),
        ("context_length_exceeded", 1, "b"),
        ("http_500", 1, "d"),
    ]
    assert groups[1].example_message == "too long"


def test_a_table_on_a_terminal_json_in_a_pipe() -> None:
    assert choose_format("auto", stdout_is_terminal=True) == Format.TABLE
    assert choose_format("auto", stdout_is_terminal=False) == Format.JSON
    assert choose_format("table", stdout_is_terminal=False) == Format.TABLE


def test_a_kubectl_object_name_is_its_batch_id() -> None:
    assert batch_id("batch-tickets") == "batch_tickets"
    assert batch_id("batch_0123") == "batch_0123"


def test_submit_takes_the_endpoint_from_the_first_request(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('\n{"custom_id": "a", "url": "/v1/embeddings", "body": {}}\n')
    assert endpoint_of(path) == "/v1/embeddings"
    path.write_text("not json\n")
    assert endpoint_of(path) == "/v1/chat/completions"


def test_metadata_pairs_and_the_flex_tier() -> None:
    assert parse_metadata(("team=a", "run=b=c"), "standard") == {"team": "a", "run": "b=c"}
    assert parse_metadata((), "flex") == {"tier": "flex"}
    with pytest.raises(click.BadParameter):
        parse_metadata(("novalue",), "standard")


def _llmbatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_shell_completion_of_the_verbs() -> None:
    script = _llmbatch(env={"_LLMBATCH_COMPLETE": "bash_source"})
    assert script.returncode == 0
    assert "complete -o nosort -F _llmbatch_completion llmbatch" in script.stdout
    words = _llmbatch(
        env={"_LLMBATCH_COMPLETE": "bash_complete", "COMP_WORDS": "llmbatch batches w",
             "COMP_CWORD": "2"},
    )  # fmt: skip
    assert words.stdout.split() == ["plain,watch"]


def test_without_the_client_extra_the_command_says_what_to_install(tmp_path: pathlib.Path) -> None:
    """The SDK made unimportable (as without ``[client]``): the help still lists the command,
    running it names the extra."""
    blocker = tmp_path / "sitecustomize.py"
    blocker.write_text("import sys\nsys.modules['openai'] = None\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    listed = _llmbatch("--help", env=env)
    assert "batches" in listed.stdout
    run = _llmbatch("batches", "list", env=env)
    assert run.returncode == 1
    assert "pip install 'llm-batch-operator[client]'" in run.stderr
