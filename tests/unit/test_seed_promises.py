"""What the product documents promise, where a crack was found (shared/seeds): seed 002's own
sample file runs on the pool of seed 002's model; a batch's ``model`` is a model id the catalog
lists and a request can use (seed 004: "Model id, settled from the input file"), its pinned
revision a field of its own; a flex batch reads ``priority: flex``; the CRD's word on
``spec.cancel`` is what a cancel does. (A request between retry attempts at a cancel finishing:
tests/unit/test_executor_retries.py.)"""

from __future__ import annotations

import copy
import json
import pathlib
import time
from typing import Any

import openai
import pytest
import yaml

from llmbatch.api.shard import ShardSpec
from llmbatch.core import keys
from llmbatch.executor.shardinput import parse_line
from tests.fixtures.builders import WORKERS, make_batch
from tests.fixtures.gateway import FakeGateway
from tests.fixtures.reconciler import ReconcilerHarness

ROOT = pathlib.Path(__file__).resolve().parents[2]
NS = "team-s"
SEED_002_MODEL = "qwen3.8-27b-batch"
SEED_002_ROWS = [
    {"custom_id": "request-1", "method": "POST", "url": "/openai/v1/chat/completions",
     "body": {"model": SEED_002_MODEL,
              "messages": [{"role": "user", "content": "Summarize this text."}]}},
    {"custom_id": "request-2", "method": "POST", "url": "/openai/v1/chat/completions",
     "body": {"model": SEED_002_MODEL,
              "messages": [{"role": "user", "content": "Classify this ticket."}]}},
]  # fmt: skip
"""Seed 002's requests.jsonl, as the document prints it: no output-token limit."""


def seed_002_pool() -> dict[str, Any]:
    """The example pool shipping seed 002's model and prices (examples/)."""
    manifest: dict[str, Any] = yaml.safe_load(
        (ROOT / "examples" / "pool-qwen3.8-27b-batch.yaml").read_text()
    )
    return manifest


def sdk(gw: FakeGateway, key: str) -> openai.OpenAI:
    """The official client on the in-process gateway (Starlette's TestClient is an httpx one)."""
    return openai.OpenAI(
        base_url="http://testserver/openai/v1", api_key=key, http_client=gw.client, max_retries=0
    )


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


# --- seed 002's sample on seed 002's pool ----------------------------------------------------


def test_seed_002s_sample_file_is_accepted_on_its_models_pool(fake_gateway: FakeGateway) -> None:
    pool = seed_002_pool()
    fake_gateway.kube.pools.append({**pool, "status": {}})
    client = sdk(fake_gateway, fake_gateway.key(NS))
    uploaded = client.files.create(file=("requests.jsonl", jsonl(SEED_002_ROWS)), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/openai/v1/chat/completions",
        completion_window="24h",
        metadata={"tier": "flex"},
    )
    assert batch.status == "validating"
    manifest = fake_gateway.kube.objects[("batchfiles", NS, uploaded.id)]
    assert manifest["spec"]["requestsWithoutOutputLimit"] == 2


def test_its_rows_run_with_the_pools_default_output_limit(tmp_path: pathlib.Path) -> None:
    """Accepted by the operator too, estimated and run with billing.defaultOutputTokens as each
    row's limit: the bill of a token-priced row stays within what its estimate reserved."""
    h = ReconcilerHarness(tmp_path)
    pool = seed_002_pool()
    pool["metadata"]["name"] = "pool-a"
    pool["spec"].update(workerNamespace=WORKERS, executor={"engine": "simulated", "flushLines": 5})
    h.kube.add("batchpools", pool)
    requests = [
        {"customID": r["custom_id"], "url": r["url"], "body": r["body"]} for r in SEED_002_ROWS
    ]
    name = "batch-" + "5" * 24
    h.kube.add("batches", make_batch(name, input_file_id=None, requests=requests))
    status = h.step_until(name, "in_progress", "failed")
    assert status["status"] == "in_progress", status.get("errors")
    assert status["billing"]["estimatedTokens"] > 2 * 1024  # the default per row, reserved
    meta = h.batch(name)["metadata"]
    key = keys.shard_spec_key(meta["namespace"], meta["uid"], 0)
    spec = ShardSpec.model_validate_json(h.store.get(key))
    assert spec.default_output_tokens == 1024
    raw = json.dumps(SEED_002_ROWS[0]).encode()
    assert parse_line(spec, 1, raw).body["max_completion_tokens"] == 1024
    bounded = copy.deepcopy(SEED_002_ROWS[0])
    bounded["body"]["max_tokens"] = 7  # a row's own limit is kept
    assert "max_completion_tokens" not in parse_line(spec, 1, json.dumps(bounded).encode()).body
    h.pool_round()
    h.step(name)
    (job,) = h.jobs()
    h.run_slot(job)
    h.pool_round()
    assert h.step_until(name, "completed")["requestCounts"]["completed"] == 2


# --- the model id and its pinned revision -------------------------------------------------------


def test_a_batchs_model_is_an_id_the_catalog_lists_and_requests_can_use(
    fake_gateway: FakeGateway,
) -> None:
    fake_gateway.serve("m")
    client = sdk(fake_gateway, fake_gateway.key(NS))
    row = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4}}  # fmt: skip
    uploaded = client.files.create(file=("r.jsonl", jsonl([row])), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # the operator accepts it and pins the pool model's revision
    (obj,) = [o for (kind, _, _), o in fake_gateway.kube.objects.items() if kind == "batches"]
    obj["status"] = {"status": "in_progress", "model": "m", "modelRevision": "r1"}
    fake_gateway.kube.changed("batches", "MODIFIED", obj)
    fake_gateway.kube.objects[("batches", NS, obj["metadata"]["name"])] = obj
    accepted = client.batches.retrieve(batch.id)
    while accepted.status == "validating":  # the read cache: at most a second old
        time.sleep(0.05)
        accepted = client.batches.retrieve(batch.id)
    assert accepted.model == "m"
    assert (accepted.model_extra or {})["model_revision"] == "r1"
    assert accepted.model in {m.id for m in client.models.list().data}
    assert client.models.retrieve(accepted.model).id == "m"
    again = {**row, "body": {**row["body"], "model": accepted.model}}
    reused = client.files.create(file=("r.jsonl", jsonl([again])), purpose="batch")
    assert (
        client.batches.create(
            input_file_id=reused.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).status
        == "validating"
    )


# --- a flex batch's priority --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "priority"),
    [({"metadata": {"tier": "flex"}}, "flex"), ({}, "standard"),
     ({"extra_body": {"priority": "flex"}}, "flex")],
)  # fmt: skip
def test_a_flex_batch_reads_flex(
    fake_gateway: FakeGateway, extra: dict[str, Any], priority: str
) -> None:
    fake_gateway.serve("m")
    client = sdk(fake_gateway, fake_gateway.key(NS))
    row = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "m", "messages": [], "max_tokens": 4}}  # fmt: skip
    uploaded = client.files.create(file=("r.jsonl", jsonl([row])), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        **extra,
    )
    assert (batch.model_extra or {})["priority"] == priority
    listed = client.batches.list().data[0]
    assert (listed.model_extra or {})["priority"] == priority
    assert (client.batches.retrieve(batch.id).model_extra or {})["priority"] == priority


# --- what the CRD says a cancel does ----------------------------------------------------------


def test_the_crd_says_running_requests_finish_at_a_cancel() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "batches.llmbatch.io.yaml").read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    cancel = " ".join(schema["properties"]["spec"]["properties"]["cancel"]["description"].split())
    assert "running requests stop" not in cancel
    assert "requests already running finish" in cancel
    assert "batch_cancelled" in cancel
