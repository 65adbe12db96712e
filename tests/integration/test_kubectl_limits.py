"""What a Batch applied with kubectl may not be, on the real control plane with the session
operator: nested deeper than a line may be (it failed with ``nesting_too_deep`` instead of being
retried forever), and a completion window longer than 72 h (the CRD refuses it at apply time)."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from tests.fixtures.operator import OperatorProcess
from tests.integration.test_operator import (
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    batch_manifest,
    chat_requests,
    make_batch,
    make_pool,
    wait_status,
)

pytestmark = pytest.mark.timeout(300)


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_batch_nested_300_levels_deep_fails_with_nesting_too_deep(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = make_pool(cluster, tmp_path)
    requests = chat_requests(2)
    requests[1]["body"]["metadata_blob"] = nested(300)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=requests)
    batch = wait_status(cluster, operator_process, namespace, name, {"failed", "in_progress"}, 60)
    status = batch["status"]
    assert status["status"] == "failed"
    assert [(e["code"], e.get("line")) for e in status["errors"]] == [("nesting_too_deep", 2)]
    assert status["requestCounts"] == {"total": 2, "completed": 0, "failed": 2}


def test_the_crd_refuses_a_completion_window_past_72h(
    cluster: Any, namespace: str, tmp_path: pathlib.Path
) -> None:
    def batch(window: str) -> dict[str, Any]:
        spec = {"endpoint": "/v1/chat/completions", "completionWindow": window}
        return batch_manifest(namespace, {**spec, "requests": chat_requests(1)})

    for window in ("999999h", "73h", "4321m"):
        path = tmp_path / f"{window}.json"
        path.write_text(json.dumps(batch(window)))
        refused = cluster.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
        assert "completionWindow is at most 72h" in refused, refused
    for window in ("72h", "4320m", "90s"):
        apply(cluster, tmp_path, batch(window))  # accepted as before
