"""Metrics the operator derives from what it observes, the instrumented store, metric hygiene and
the JSON log format."""

from __future__ import annotations

import io
import json
import logging
import pathlib
import sys
import time
import uuid
from typing import Any

import pytest

from llmbatch import logs
from llmbatch.controller import metrics
from llmbatch.gateway import metrics as gateway_metrics
from llmbatch.storage import FilesystemStore, ObjectNotFound

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def batch(
    status: str, *, pool: str, completed: int = 0, failed: int = 0, shards: Any = None
) -> dict[str, Any]:
    return {
        "metadata": {"uid": "u", "name": "batch-x", "namespace": "t"},
        "spec": {"priority": "flex"},
        "status": {
            "status": status,
            "pool": pool,
            "createdAt": int(time.time()) - 100,
            "requestCounts": {"total": 10, "completed": completed, "failed": failed},
            "shards": shards or [],
        },
    }


def test_progress_first_result_shards_and_duration_from_successive_reconciles() -> None:
    pool, uid = f"p-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    first = sample("llmbatch_batch_first_result_seconds_count", tier="flex")
    done = sample("llmbatch_batch_duration_seconds_count", tier="flex", status="completed")

    def observe(status: str, **kw: Any) -> None:
        body = batch(status, pool=pool, **kw)
        metrics.observe_batch(uid, status, body, {})

    observe("in_progress", shards=[{"index": 0, "phase": "Running", "reruns": 0}])
    observe("in_progress", completed=4, shards=[{"index": 0, "phase": "Failed", "reruns": 0}])
    observe(
        "in_progress", completed=8, failed=1, shards=[{"index": 0, "phase": "Running", "reruns": 1}]
    )
    assert (
        sample(
            "llmbatch_pool_requests_processed_total", pool=pool, tier="flex", outcome="completed"
        )
        == 8
    )
    assert (
        sample("llmbatch_pool_requests_processed_total", pool=pool, tier="flex", outcome="failed")
        == 1
    )
    assert sample("llmbatch_batch_first_result_seconds_count", tier="flex") == first + 1
    assert sample("llmbatch_shard_failures_total", pool=pool) == 1
    assert sample("llmbatch_shard_reruns_total", pool=pool) == 1
    assert sample("llmbatch_batch_oldest_in_status_seconds", status="in_progress") >= 0

    # The reconcile that moves it to completed: body still in_progress, the patch says completed.
    body = batch("in_progress", pool=pool, completed=9, failed=1)
    metrics.observe_batch(uid, "completed", body, {"status": "completed"})
    assert (
        sample("llmbatch_batch_duration_seconds_count", tier="flex", status="completed") == done + 1
    )
    assert (
        sample(
            "llmbatch_requests_unsuccessful_total", pool=pool, tier="flex", reason="request_error"
        )
        == 1
    )
    # A later look at the finished batch counts nothing twice.
    metrics.observe_batch(
        uid, "completed", batch("completed", pool=pool, completed=9, failed=1), {}
    )
    assert (
        sample("llmbatch_batch_duration_seconds_count", tier="flex", status="completed") == done + 1
    )
    metrics.observe_batch(uid, None)


def test_a_batch_first_seen_mid_run_gets_no_first_result() -> None:
    """After a restart the operator cannot know when the first result came."""
    pool, uid = f"p-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    first = sample("llmbatch_batch_first_result_seconds_count", tier="flex")
    metrics.observe_batch(uid, "in_progress", batch("in_progress", pool=pool, completed=5), {})
    metrics.observe_batch(uid, "in_progress", batch("in_progress", pool=pool, completed=7), {})
    assert sample("llmbatch_batch_first_result_seconds_count", tier="flex") == first
    assert (
        sample(
            "llmbatch_pool_requests_processed_total", pool=pool, tier="flex", outcome="completed"
        )
        == 2
    )
    metrics.observe_batch(uid, None)


def test_pool_round_sets_backlog_drain_and_initialises_counters() -> None:
    pool = f"p-{uuid.uuid4().hex[:6]}"
    metrics.observe_pool(
        pool, {"standard": 40, "flex": 0}, {"standard": 3600, "flex": 86400}, 4, 2.5
    )
    assert sample("llmbatch_pool_backlog_requests", pool=pool, tier="standard") == 40
    assert sample("llmbatch_pool_drain_target_seconds", pool=pool, tier="flex") == 86400
    assert sample("llmbatch_pool_max_slots", pool=pool) == 4
    assert sample("llmbatch_pool_slot_throughput_requests_per_second", pool=pool) == 2.5
    assert metrics.REGISTRY.get_sample_value("llmbatch_shard_failures_total", {"pool": pool}) == 0
    assert sample("llmbatch_operator_last_reconcile_timestamp_seconds") > time.time() - 60


def test_instrumented_store_times_calls_and_counts_failures_not_misses(
    tmp_path: pathlib.Path,
) -> None:
    store = metrics.instrument_store(FilesystemStore(tmp_path))
    puts = sample("llmbatch_store_operation_seconds_count", op="put")
    errors = sample("llmbatch_store_errors_total", op="get")
    store.put("a/b", b"x")
    assert store.get("a/b") == b"x"
    with pytest.raises(ObjectNotFound):
        store.get("a/missing")
    assert sample("llmbatch_store_operation_seconds_count", op="put") == puts + 1
    assert sample("llmbatch_store_errors_total", op="get") == errors


def test_metric_names_labels_and_the_generated_table() -> None:
    sys.path.insert(0, str(ROOT / "hack"))
    try:
        import gen_metrics_doc
    finally:
        sys.path.pop(0)
    assert gen_metrics_doc.problems() == []
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert gen_metrics_doc.render(doc) == doc, "run `make gen`"
    names = {row[0] for row in gen_metrics_doc.rows()}
    assert "llmbatch_gateway_store_errors_total" in names
    assert gateway_metrics.REGISTRY is not metrics.REGISTRY


def test_json_logs_carry_batch_shard_and_tenant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    stream = io.StringIO()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("INFO", stream=stream)
        log = logging.getLogger("llmbatch.test")
        with logs.bind(batch_id="batch_abc", tenant="team-a"):
            log.info("hello %s", "world", extra={"shard": 3})
        log.info("plain")
        kopf_like = {"k8s_ref": {"kind": "Batch", "name": "batch-def", "namespace": "team-b"}}
        log.warning("from kopf", extra=kopf_like)
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "hello world"
    assert (first["batch_id"], first["shard"], first["tenant"]) == ("batch_abc", 3, "team-a")
    assert "batch_id" not in second
    assert second["level"] == "INFO"
    assert (third["batch_id"], third["tenant"]) == ("batch_def", "team-b")


def test_text_logs_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    assert not logs.json_requested()
    assert logs.uvicorn_log_config() is None
