"""The chart's Prometheus rules, checked by Debian's promtool (``make prometheus``): they parse,
every alert has a unit test in hack/prometheus/rules-test.yaml and a runbook in
docs/operations.md, and the unit tests pass."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "llm-batch-operator" / "files" / "prometheus-rules.yaml"
RULE_TESTS = ROOT / "hack" / "prometheus" / "rules-test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing: `make prometheus` installs it (make test does)")
        pytest.skip("promtool is missing: run `make prometheus`")
    return path


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def test_promtool_check_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert {str(rule["alert"]) for rule in alerts()} <= firing


def test_every_alert_has_a_runbook() -> None:
    doc = OPERATIONS.read_text()
    anchors = {m.lower() for m in re.findall(r"^#### (\w+)$", doc, re.MULTILINE)}
    for rule in alerts():
        name = str(rule["alert"])
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == f"docs/operations.md#{name.lower()}"
        assert name.lower() in anchors, f"docs/operations.md has no `#### {name}` runbook"
