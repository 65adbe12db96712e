"""`llmbatch validate` as a user runs it."""

from __future__ import annotations

import json
import pathlib

from click.testing import CliRunner

from llmbatch.cli import main

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "seed000-requests.jsonl"


def test_ok_summary() -> None:
    result = CliRunner().invoke(main, ["validate", str(EXAMPLE)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("OK: 2 requests, model ")


def test_errors_with_lines_and_nonzero_exit(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(EXAMPLE.read_text() + "{nope\n")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 1
    assert "line 3: invalid_json_line" in result.output


def test_json_output_is_openai_errors_object(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(EXAMPLE.read_text().replace("/v1/chat/completions", "/v1/completions", 1))
    result = CliRunner().invoke(main, ["validate", "--json", str(bad)])
    assert result.exit_code == 1
    errors = json.loads(result.stdout)
    assert errors["object"] == "list"
    assert errors["data"][0]["code"] == "mismatched_url"
    assert errors["data"][0]["line"] == 1


def test_limits_are_configurable(tmp_path: pathlib.Path) -> None:
    result = CliRunner().invoke(main, ["validate", "--max-requests", "1", str(EXAMPLE)])
    assert result.exit_code == 1
    assert "too_many_requests" in result.output


def test_unsupported_endpoint_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["validate", "--endpoint", "/v1/moderations", str(EXAMPLE)])
    assert result.exit_code == 2
    assert "Unsupported endpoint" in result.output
