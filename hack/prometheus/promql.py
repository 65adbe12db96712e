"""The queries of the chart's dashboard and rules, and a small client of Prometheus' HTTP API
(shared by tests/integration/test_observability.py and hack/prometheus/plot_panels.py)."""

from __future__ import annotations

import json
import pathlib
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_FILES = ROOT / "charts" / "llm-batch-operator" / "files"
DASHBOARD = CHART_FILES / "dashboard.json"
RULES = CHART_FILES / "prometheus-rules.yaml"
#: Dashboard variables as a test or a plot fills them: every pool, every tier.
VARIABLES = {"$pool": ".*", "$tier": ".*", "$__rate_interval": "1m"}
METRIC = re.compile(r"\b(llmbatch_[a-z0-9_]+)")


def panel_queries(rate_interval: str = "1m") -> list[tuple[str, str, str]]:
    """(panel title, legend, PromQL with the variables filled in) of every dashboard query."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in {**VARIABLES, "$__rate_interval": rate_interval}.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], target.get("legendFormat", ""), expr))
    return out


def rules() -> list[dict[str, Any]]:
    """Every rule of the rule file."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """Metric families an expression names (histogram suffixes stripped)."""
    return {re.sub(r"_(bucket|count|sum)$", "", m) for m in METRIC.findall(expr)}


class PrometheusAPI:
    """``/api/v1`` of one Prometheus."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base_url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=30) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # 400 with a JSON error for a bad query
            body = json.loads(err.read())
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.get("query", **params)
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.get(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def metric_names(self) -> set[str]:
        return set(self.get("label/__name__/values"))
