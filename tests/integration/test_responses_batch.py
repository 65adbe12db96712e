"""/v1/responses batches on the real control plane: the official ``openai`` SDK through the
gateway, and a kubectl Batch, run by the operator and shard pods on the simulated engine.

Every output body parses as the SDK's ``Response``; the batch's usage is the sum of the lines'
``input_tokens`` / ``output_tokens`` and its Tokens-mode cost follows from them. A catalog pool
requires ``max_output_tokens`` on every row; stateful fields are refused naming the line.
"""

from __future__ import annotations

import json
import pathlib
import uuid
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai.types.responses import Response

from llmbatch.core.ids import batch_object_name
from tests.fixtures.operator import ClusterCLI, OperatorProcess, catalog_pool
from tests.integration.test_gateway import eventually
from tests.integration.test_operator import (
    _POOLS,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    get_batch,
    read_lines,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
RESPONSES = "/v1/responses"


@pytest.fixture
def catalog_model(cluster: ClusterCLI, tmp_path: pathlib.Path) -> str:
    """A simulated catalog (Tokens) pool serving a model of its own; 1,000 / 2,000 per 1M."""
    name, model = f"pool-{uuid.uuid4().hex[:8]}", f"resp-model-{uuid.uuid4().hex[:6]}"
    _POOLS.append(name)
    apply(cluster, tmp_path, catalog_pool(name, model, output_tokens=6))
    return model


def _row(i: int, model: str, **body: Any) -> dict[str, Any]:
    fields = {"model": model, "input": f"Summarize ticket {i}.", "max_output_tokens": 4, **body}
    return {"custom_id": f"req-{i}", "method": "POST", "url": RESPONSES, "body": fields}


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_sdk_responses_batch_round_trip(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenant: tuple[str, openai.OpenAI],
    catalog_model: str,
) -> None:
    namespace, client = tenant
    items = [{"role": "user", "content": "Count to three."}]
    rows = [
        _row(0, catalog_model),
        _row(1, catalog_model, input=items, instructions="Be brief.", store=True),
        _row(2, catalog_model, max_output_tokens=64),
    ]
    uploaded = client.files.create(file=("responses.jsonl", _jsonl(rows)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=RESPONSES, completion_window="24h"
    )
    assert batch.endpoint == RESPONSES
    name = batch_object_name(batch.id)
    status = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    # The gateway's read cache answers a poll past its TTL with the last answer while it
    # refreshes (docs/gateway.md): the SDK view follows the object within a poll or two.
    done = eventually(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
    assert done.status == "completed", status
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.output_file_id is not None
    lines = [json.loads(raw) for raw in client.files.content(done.output_file_id).text.splitlines()]
    parsed = {
        line["custom_id"]: Response.model_validate(line["response"]["body"]) for line in lines
    }
    assert set(parsed) == {"req-0", "req-1", "req-2"}
    for response in parsed.values():
        assert (response.object, response.model) == ("response", catalog_model)
        assert response.output_text
    assert parsed["req-0"].status == "incomplete"  # cut at max_output_tokens=4
    assert parsed["req-2"].status == "completed"
    inputs = sum(r.usage.input_tokens for r in parsed.values() if r.usage)
    outputs = sum(r.usage.output_tokens for r in parsed.values() if r.usage)
    assert outputs == 4 + 4 + 6
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens) == (inputs, outputs)
    assert done.usage.total_tokens == inputs + outputs
    cost = Decimal(status["cost"])
    assert cost == (Decimal(inputs) * 1000 + Decimal(outputs) * 2000) / 1_000_000


def test_sdk_upload_refuses_bad_responses_rows_naming_the_line(
    tenant: tuple[str, openai.OpenAI], catalog_model: str
) -> None:
    _, client = tenant
    cases = [
        (_row(1, catalog_model, previous_response_id="resp_1"), "body.previous_response_id"),
        (_row(1, catalog_model, max_output_tokens=None), "body.max_output_tokens"),
    ]
    for bad, param in cases:
        data = _jsonl([_row(0, catalog_model), bad])
        with pytest.raises(openai.BadRequestError) as err:
            client.files.create(file=("bad.jsonl", data), purpose="batch")
        body = err.value.body
        assert isinstance(body, dict)
        assert body["param"] == param
        assert body["message"].startswith("Line 2: ")


def test_kubectl_responses_batch_runs_and_fails_a_stateful_row(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenant: tuple[str, openai.OpenAI],
    catalog_model: str,
    tmp_path: pathlib.Path,
) -> None:
    namespace, _ = tenant

    def batch(rows: list[dict[str, Any]]) -> str:
        name = f"batch-{uuid.uuid4().hex[:24]}"
        requests = [
            {"customID": r["custom_id"], "method": "POST", "url": r["url"], "body": r["body"]}
            for r in rows
        ]
        spec = {"endpoint": RESPONSES, "completionWindow": "24h", "requests": requests}
        manifest = {"apiVersion": "llmbatch.io/v1alpha1", "kind": "Batch", "spec": spec}
        apply(cluster, tmp_path, {**manifest, "metadata": {"name": name, "namespace": namespace}})
        return name

    good = batch([_row(0, catalog_model), _row(1, catalog_model)])
    stateful = batch([_row(0, catalog_model), _row(1, catalog_model, background=True)])
    status = wait_status(cluster, operator_process, namespace, good, {"completed"})["status"]
    assert status["requestCounts"]["completed"] == 2
    outputs = read_lines(operator_process, namespace, status["outputFileID"])
    assert all(Response.model_validate(line["response"]["body"]) for line in outputs)
    failed = wait_status(cluster, operator_process, namespace, stateful, {"failed"})["status"]
    assert [(e["code"], e.get("line"), e.get("param")) for e in failed["errors"]] == [
        ("unsupported_parameter", 2, "body.background")
    ]
    assert get_batch(cluster, namespace, stateful)["spec"]["endpoint"] == RESPONSES
