#!/usr/bin/env python3
"""Generate the chart's Grafana dashboard (charts/llm-batch-operator/files/dashboard.json).

python hack/grafana/gen_dashboard.py           write it
python hack/grafana/gen_dashboard.py --check   exit 1 when it differs or is missing

The panels below are the on-call questions, per pool and tier. Every query names only metrics the
operator or the gateway export, or recording rules of files/prometheus-rules.yaml;
tests/integration/test_observability.py evaluates each one against a real Prometheus scraping a
real run and fails when one returns nothing. ``$pool`` and ``$tier`` are dashboard variables.
"""

# ruff: noqa: E501  (PromQL queries read best unbroken)

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "charts" / "llm-batch-operator" / "files" / "dashboard.json"
UID = "llmbatch-overview"

P = '{pool=~"$pool"}'
PT = '{pool=~"$pool",tier=~"$tier"}'
T = '{tier=~"$tier"}'

# (row title, [(panel title, unit, [(legend, expr)], description)])
Panel = tuple[str, str, list[tuple[str, str]], str]
ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Backlog and slots",
        [
            (
                "Backlog (requests)",
                "short",
                [("{{pool}} {{tier}}", f"llmbatch:pool_tier_backlog_requests:max{PT}")],
                "Requests of unfinished shards per pool and tier. Token backlog is not exported.",
            ),
            (
                "Shards waiting for a slot",
                "short",
                [
                    (
                        "{{pool}} {{tier}}",
                        f"max by (pool, tier) (llmbatch_pool_queue_depth_shards{PT})",
                    )
                ],
                "",
            ),
            (
                "Drain time at maxSlots vs target",
                "s",
                [
                    (
                        "{{pool}} {{tier}} estimate",
                        f"llmbatch:pool_tier_drain_seconds:at_max_slots{PT}",
                    ),
                    (
                        "{{pool}} {{tier}} target",
                        f"max by (pool, tier) (llmbatch_pool_drain_target_seconds{PT})",
                    ),
                ],
                "Best case: the backlog over (throughput per slot * maxSlots). Above the target "
                "the tier misses it whatever the autoscaler does.",
            ),
            (
                "Slots: busy / warm / desired / max",
                "short",
                [
                    ("{{pool}} busy", f"max by (pool) (llmbatch_pool_jobs_running{P})"),
                    ("{{pool}} warm", f"max by (pool) (llmbatch_pool_warm_slots{P})"),
                    ("{{pool}} desired", f"max by (pool) (llmbatch_pool_desired_slots{P})"),
                    ("{{pool}} max", f"max by (pool) (llmbatch_pool_max_slots{P})"),
                ],
                "Warm slots hold their model loaded; busy ones run at least one shard.",
            ),
            (
                "Slot utilisation (busy / max)",
                "percentunit",
                [("{{pool}}", f"llmbatch:pool_slot_utilisation:ratio{P}")],
                "Slots running at least one shard, over maxSlots.",
            ),
            (
                "Engine busy fraction (heartbeats)",
                "percentunit",
                [
                    (
                        "{{pool}}",
                        'sum by (pool) (rate(llmbatch_slot_seconds_total{pool=~"$pool",status="busy"}[5m])) '
                        f"/ sum by (pool) (rate(llmbatch_slot_seconds_total{P}[5m]))",
                    )
                ],
                "Time with at least one request in a slot's engine over its loaded time "
                "(busy + idle): what warm slots keep high.",
            ),
            (
                "Engine starts and shard assignments",
                "short",
                [
                    (
                        "{{pool}} engine starts / h",
                        f"sum by (pool) (increase(llmbatch_slot_starts_total{P}[1h]))",
                    ),
                    (
                        "{{pool}} assignments / h",
                        f"sum by (pool) (increase(llmbatch_slot_assignments_total{P}[1h]))",
                    ),
                ],
                "Each slot start loads the model once; assignments include re-runs.",
            ),
            (
                "Wait for a first slot (p95)",
                "s",
                [
                    (
                        "{{pool}}",
                        "histogram_quantile(0.95, sum by (pool, le) "
                        f"(rate(llmbatch_slot_assignment_wait_seconds_bucket{P}[1h])))",
                    )
                ],
                "From a batch starting to run to each shard's first assignment.",
            ),
            (
                "Throughput per slot (assumed or learned)",
                "reqps",
                [
                    (
                        "{{pool}}",
                        f"max by (pool) (llmbatch_pool_slot_throughput_requests_per_second{P})",
                    )
                ],
                "",
            ),
        ],
    ),
    (
        "Batches",
        [
            (
                "Batches by status",
                "short",
                [("{{status}}", "max by (status) (llmbatch_batches)")],
                "",
            ),
            (
                "Oldest batch in each status",
                "s",
                [("{{status}}", "max by (status) (llmbatch_batch_oldest_in_status_seconds)")],
                "Age in its current status of the oldest batch per status.",
            ),
            (
                "Status transitions",
                "ops",
                [
                    (
                        "{{status}}",
                        "sum by (status) (rate(llmbatch_batch_transitions_total[$__rate_interval]))",
                    )
                ],
                "",
            ),
            (
                "Time to first result p50 / p95",
                "s",
                [
                    ("{{tier}} p50", f"llmbatch:batch_first_result_seconds:p50{T}"),
                    ("{{tier}} p95", f"llmbatch:batch_first_result_seconds:p95{T}"),
                ],
                "",
            ),
            (
                "Time to completion p50 / p95",
                "s",
                [
                    ("{{tier}} p50", f"llmbatch:batch_duration_seconds:p50{T}"),
                    ("{{tier}} p95", f"llmbatch:batch_duration_seconds:p95{T}"),
                ],
                "Creation to completed.",
            ),
            (
                "Validation and finalisation p95",
                "s",
                [
                    (
                        "validate",
                        "histogram_quantile(0.95, sum by (le) (rate(llmbatch_validation_duration_seconds_bucket[$__rate_interval])))",
                    ),
                    (
                        "finalize",
                        "histogram_quantile(0.95, sum by (le) (rate(llmbatch_finalize_duration_seconds_bucket[$__rate_interval])))",
                    ),
                ],
                "",
            ),
        ],
    ),
    (
        "Throughput and outcomes",
        [
            (
                "Requests processed",
                "reqps",
                [("{{pool}} {{tier}} {{outcome}}", f"llmbatch:pool_requests_processed:rate5m{PT}")],
                "As shards report progress.",
            ),
            (
                "Tokens (finished batches)",
                "short",
                [("{{direction}}", "llmbatch:tokens:rate5m")],
                "Tokens per second of successful requests, counted when batches finish.",
            ),
            (
                "Error lines by reason",
                "short",
                [
                    (
                        "{{pool}} {{tier}} {{reason}}",
                        f"sum by (pool, tier, reason) (increase(llmbatch_requests_unsuccessful_total{PT}[1h]))",
                    )
                ],
                "request_error: failed lines of completed batches; failed / expired / cancelled: "
                "error lines of batches ending so.",
            ),
            (
                "Requests of finished batches",
                "short",
                [("{{outcome}}", "sum by (outcome) (increase(llmbatch_batch_requests_total[1h]))")],
                "",
            ),
        ],
    ),
    (
        "Shards",
        [
            (
                "Shard failures and re-runs (15 min)",
                "short",
                [
                    ("{{pool}} failed", f"llmbatch:shard_failures:increase15m{P}"),
                    ("{{pool}} re-runs", f"llmbatch:shard_reruns:increase15m{P}"),
                ],
                "Executor exit codes are in each shard's status message, not in metrics.",
            ),
            (
                "Shard run time p50 / p95",
                "s",
                [
                    (
                        "{{pool}} p50",
                        f"histogram_quantile(0.5, sum by (pool, le) (rate(llmbatch_shard_run_seconds_bucket{P}[1h])))",
                    ),
                    (
                        "{{pool}} p95",
                        f"histogram_quantile(0.95, sum by (pool, le) (rate(llmbatch_shard_run_seconds_bucket{P}[1h])))",
                    ),
                ],
                "",
            ),
            (
                "Incomplete shards (executor invariant broken)",
                "short",
                [("incomplete", "sum(increase(llmbatch_shard_incomplete_total[1h]))")],
                "",
            ),
        ],
    ),
    (
        "Object store",
        [
            (
                "Store error ratio",
                "percentunit",
                [("{{component}}", "llmbatch:store_errors:ratio_rate5m")],
                "",
            ),
            (
                "Store latency p95",
                "s",
                [("{{component}} {{op}}", "llmbatch:store_operation_seconds:p95")],
                "",
            ),
            (
                "Store calls",
                "ops",
                [
                    (
                        "operator {{op}}",
                        "sum by (op) (rate(llmbatch_store_operation_seconds_count[$__rate_interval]))",
                    ),
                    (
                        "gateway {{op}}",
                        "sum by (op) (rate(llmbatch_gateway_store_operation_seconds_count[$__rate_interval]))",
                    ),
                ],
                "",
            ),
        ],
    ),
    (
        "Gateway",
        [
            (
                "Requests by route and code",
                "reqps",
                [("{{route}} {{code}}", "llmbatch:gateway_requests:rate5m")],
                "",
            ),
            (
                "Errors by route (4xx and 5xx)",
                "reqps",
                [
                    (
                        "{{route}} {{code}}",
                        'sum by (route, code) (rate(llmbatch_gateway_requests_total{code=~"4..|5.."}[$__rate_interval]))',
                    )
                ],
                "",
            ),
            (
                "5xx ratio",
                "percentunit",
                [("5xx", "llmbatch:gateway_5xx:ratio_rate5m")],
                "",
            ),
            (
                "Latency p95 by route",
                "s",
                [("{{route}}", "llmbatch:gateway_request_seconds:p95")],
                "",
            ),
            (
                "Authentication failures",
                "ops",
                [
                    (
                        "{{reason}}",
                        "sum by (reason) (rate(llmbatch_gateway_auth_failures_total[$__rate_interval]))",
                    )
                ],
                "",
            ),
            (
                "Upload bytes",
                "Bps",
                [("uploads", "sum(rate(llmbatch_gateway_upload_bytes_total[$__rate_interval]))")],
                "",
            ),
        ],
    ),
    (
        "Tenants",
        [
            (
                "Tenants with work",
                "short",
                [("{{pool}}", f"max by (pool) (llmbatch_pool_tenants_active{P})")],
                "Namespaces with shards waiting or running on the pool (fair sharing, docs/pools.md).",
            ),
            (
                "Largest seats / fair share",
                "short",
                [("{{pool}}", f"max by (pool) (llmbatch_pool_tenant_share_ratio_max{P})")],
                "Above 1: a tenant borrows idle share (work-conserving) or the order has not caught "
                "up yet; held above 1 while others wait, look at fairSharing.tenants.",
            ),
            (
                "Seats per tenant vs fair share",
                "short",
                [
                    (
                        "{{pool}} {{tenant}} seats",
                        f"max by (pool, tenant) (llmbatch_pool_tenant_seats{P})",
                    ),
                    (
                        "{{pool}} {{tenant}} share",
                        f"max by (pool, tenant) (llmbatch_pool_tenant_fair_share_seats{P})",
                    ),
                ],
                "The 20 tenants each pool's status lists; only with "
                "LLMBATCH_METRICS_TENANT_LABELS=true (tenants are unbounded).",
            ),
            (
                "Preemptions across tenants",
                "ops",
                [
                    (
                        "{{pool}}",
                        f"sum by (pool) (rate(llmbatch_pool_tenant_preemptions_total{P}[$__rate_interval]))",
                    )
                ],
                "fairSharing.preemption: BelowGuarantee taking seats back for a tenant below its "
                "guarantee.",
            ),
        ],
    ),
    (
        "Credit and operator",
        [
            (
                "Credit charged per tenant (1 h)",
                "short",
                [("{{tenant}}", "sum by (tenant) (increase(llmbatch_credits_charged_total[1h]))")],
                "tenant is the namespace when LLMBATCH_NAMESPACES bounds the tenants, else empty.",
            ),
            (
                "Credit reserved by the gateway (1 h)",
                "short",
                [("reserved", "sum(increase(llmbatch_gateway_credits_reserved_total[1h]))")],
                "",
            ),
            (
                "Seconds since the last reconcile",
                "s",
                [("operator", "time() - max(llmbatch_operator_last_reconcile_timestamp_seconds)")],
                "Alert LLMBatchOperatorNotReconciling fires above 300 s.",
            ),
        ],
    ),
]


def _panel(panel_id: int, x: int, y: int, spec: Panel) -> dict[str, Any]:
    title, unit, targets, description = spec
    return {
        "id": panel_id,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 8, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
            }
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def _variable(name: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "definition": query,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": "All", "value": "$__all"},
        "refresh": 2,
        "sort": 1,
    }


def build() -> dict[str, Any]:
    """The dashboard model."""
    panels: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row, specs in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y = panel_id + 1, y + 1
        for i, spec in enumerate(specs):
            panels.append(_panel(panel_id, (i % 3) * 8, y + (i // 3) * 8, spec))
            panel_id += 1
        y += ((len(specs) + 2) // 3) * 8
    return {
        "uid": UID,
        "title": "LLM batch operator",
        "description": "Backlog, slots, batches, throughput, shards, store, gateway and credit of "
        "llm-batch-operator (generated by hack/grafana/gen_dashboard.py).",
        "tags": ["llm-batch-operator"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {"selected": False, "text": "Prometheus", "value": "prometheus"},
                },
                _variable("pool", "label_values(llmbatch_pool_max_slots, pool)"),
                _variable("tier", "label_values(llmbatch_pool_backlog_requests, tier)"),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of the dashboard."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail on drift instead of writing")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run `make gen`", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
