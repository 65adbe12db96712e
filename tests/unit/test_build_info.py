"""The build-info metrics, and the finished-request counter under its new name beside the
deprecated one it replaces for a release."""

from __future__ import annotations

import json
import pathlib
import subprocess
import urllib.request

import pytest

from llmbatch import __version__, buildinfo
from llmbatch.controller import metrics
from llmbatch.gateway import metrics as gateway_metrics
from tests.fixtures.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _fresh_revision() -> None:
    buildinfo.revision.cache_clear()


def test_the_revision_baked_into_an_image_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(buildinfo.REVISION_ENV, "0123abc")
    assert buildinfo.build_labels() == {"version": __version__, "revision": "0123abc"}


def test_a_checkout_reports_its_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(buildinfo.REVISION_ENV, raising=False)
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert buildinfo.revision() == head


def test_no_checkout_and_no_variable_is_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    monkeypatch.delenv(buildinfo.REVISION_ENV, raising=False)
    monkeypatch.setattr(buildinfo, "SOURCE_ROOT", tmp_path)
    assert buildinfo.revision() == "unknown"


def test_the_operator_and_the_gateway_export_their_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(buildinfo.REVISION_ENV, "feedbeef")
    metrics.serve(0)
    labels = {"version": __version__, "revision": "feedbeef"}
    assert metrics.REGISTRY.get_sample_value("llmbatch_build_info", labels) == 1
    with gateway_metrics.serving(free_port(), "127.0.0.1") as port:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    expected = f'llmbatch_gateway_build_info{{revision="feedbeef",version="{__version__}"}} 1.0'
    assert expected in text.decode()


def test_finished_requests_are_counted_under_both_names() -> None:
    def both(outcome: str) -> tuple[float, float]:
        new = metrics.REGISTRY.get_sample_value(
            "llmbatch_batch_requests_total", {"outcome": outcome}
        )
        old = metrics.REGISTRY.get_sample_value("llmbatch_requests_total", {"outcome": outcome})
        assert new is not None
        assert old is not None
        return new, old

    before = both("completed"), both("failed")
    metrics.count_finished_requests(completed=7, failed=2)
    assert both("completed") == (before[0][0] + 7, before[0][1] + 7)
    assert both("failed") == (before[1][0] + 2, before[1][1] + 2)


def test_the_dashboard_uses_the_new_name_and_the_doc_marks_the_old_one_deprecated() -> None:
    dashboard = json.loads((ROOT / "charts/llm-batch-operator/files/dashboard.json").read_text())
    assert "llmbatch_requests_total" not in json.dumps(dashboard)
    assert "llmbatch_batch_requests_total" in json.dumps(dashboard)
    table = (ROOT / "docs/operations.md").read_text()
    (row,) = [line for line in table.splitlines() if line.startswith("| `llmbatch_requests_total`")]
    assert "DEPRECATED" in row
