"""Seed promises through the official openai SDK, a gateway on the session operator's store and the
real operator (simulated engine): a batch's ``model`` is a model id the catalog lists and a
request can use, its pinned revision a field of its own (seed 004: "Model id, settled from the
input file"); seed 002's own sample file runs on a pool like seed 002's, each row bounded by the
pool's default output limit; a flex batch reads ``priority: flex``; a namespace's ResourceQuota
answers 429."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.operator import OperatorProcess, simulated_pool

pytestmark = pytest.mark.timeout(300)
TERMINAL = {"completed", "failed", "expired", "cancelled"}


@pytest.fixture
def pools(gateway: GatewayProcess) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        gateway.kubectl("delete", "batchpool", name, "--wait=false", check=False)


def add_pool(gateway: GatewayProcess, made: list[str], manifest: dict[str, Any]) -> None:
    gateway.kubectl("apply", "-f", "-", obj=manifest)
    made.append(manifest["metadata"]["name"])


def finished(client: openai.OpenAI, batch_id: str, operator: OperatorProcess) -> Any:
    deadline = time.monotonic() + 180
    while (batch := client.batches.retrieve(batch_id)).status not in TERMINAL:
        if time.monotonic() > deadline:
            pytest.fail(f"batch {batch_id} stuck in {batch.status}\n{operator.logs()[-6000:]}")
        time.sleep(0.5)
    return batch


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def test_a_batchs_model_is_the_id_and_its_pinned_revision_a_field_of_its_own(
    gateway: GatewayProcess,
    tenant: tuple[str, openai.OpenAI],
    operator_process: OperatorProcess,
    pools: list[str],
) -> None:
    _, client = tenant
    model = f"sim-{uuid.uuid4().hex[:6]}"
    manifest = simulated_pool(f"pool-{uuid.uuid4().hex[:8]}", model)
    manifest["spec"]["models"][0]["revision"] = "r7"
    add_pool(gateway, pools, manifest)
    row = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4}}  # fmt: skip
    uploaded = client.files.create(file=("in.jsonl", jsonl([row])), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = finished(client, created.id, operator_process)
    assert batch.status == "completed"
    assert batch.model == model  # the id the rows name, not name@revision
    assert (batch.model_extra or {})["model_revision"] == "r7"
    assert batch.model in {m.id for m in client.models.list().data}
    assert client.models.retrieve(batch.model).id == model
    # the id is one a request can use: a batch naming it runs
    again = {**row, "body": {**row["body"], "model": batch.model}}
    reused = client.files.create(file=("in.jsonl", jsonl([again])), purpose="batch")
    rerun = client.batches.create(
        input_file_id=reused.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert finished(client, rerun.id, operator_process).status == "completed"


def test_seed_002s_sample_runs_on_its_pool_bounded_by_the_default_output_limit(
    gateway: GatewayProcess,
    tenant: tuple[str, openai.OpenAI],
    operator_process: OperatorProcess,
    pools: list[str],
) -> None:
    """Seed 002's requests.jsonl (no output-token limit) on a token-priced pool that accepts
    such rows, as the example pool of seed 002's model does: accepted, and each row runs with
    the pool's billing.defaultOutputTokens (7 here) as its limit — the engine would write 500."""
    _, v1 = tenant
    client = v1.with_options(base_url=str(v1.base_url).replace("/v1", "/openai/v1"))
    model = f"qwen-{uuid.uuid4().hex[:6]}"
    manifest = simulated_pool(
        f"pool-{uuid.uuid4().hex[:8]}",
        model,
        billing={"mode": "Tokens", "defaultOutputTokens": 7},
        limits={"requireOutputTokenLimit": False},
        executor={"engineArgs": ["--latency-seconds=0.01", "--default-output-tokens=500"]},
    )
    add_pool(gateway, pools, manifest)
    rows = [
        {
            "custom_id": f"request-{i}",
            "method": "POST",
            "url": "/openai/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]},
        }
        for i, text in enumerate(["Summarize this text.", "Classify this ticket."], start=1)
    ]
    uploaded = client.files.create(file=("requests.jsonl", jsonl(rows)), purpose="batch")
    created = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/openai/v1/chat/completions",
        completion_window="24h",
        metadata={"tier": "flex"},
    )
    assert (created.model_extra or {})["priority"] == "flex"
    batch = finished(client, created.id, operator_process)
    assert batch.status == "completed", batch.errors
    assert (batch.model_extra or {})["priority"] == "flex"
    assert batch.request_counts is not None
    assert batch.request_counts.completed == 2
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["response"]["body"]["usage"]["completion_tokens"] for line in lines] == [7, 7]
    assert batch.usage is not None
    assert batch.usage.output_tokens == 14


def test_a_namespace_resource_quota_answers_429(
    gateway: GatewayProcess, tenant: tuple[str, openai.OpenAI], pools: list[str]
) -> None:
    namespace, client = tenant
    model = f"sim-{uuid.uuid4().hex[:6]}"
    add_pool(gateway, pools, simulated_pool(f"pool-{uuid.uuid4().hex[:8]}", model))
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "llmbatch", "namespace": namespace},
        "spec": {"hard": {"count/batches.llmbatch.io": "1"}},
    }
    gateway.kubectl("apply", "-f", "-", obj=quota)
    row = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": model, "messages": [], "max_tokens": 4}}  # fmt: skip
    file_id = client.files.create(file=("in.jsonl", jsonl([row])), purpose="batch").id

    def create() -> Any:
        return client.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )

    def counted() -> bool:  # the quota controller fills in what is used
        got = gateway.kubectl("get", "resourcequota", "llmbatch", "-n", namespace, "-o", "json")
        return bool(json.loads(got).get("status", {}).get("used"))

    deadline = time.monotonic() + 30
    while not counted():
        assert time.monotonic() < deadline, "the ResourceQuota has no status"
        time.sleep(0.5)
    create()
    with pytest.raises(openai.RateLimitError) as refused:
        create()
    assert refused.value.code == "resource_quota_exceeded"
    assert refused.value.response.headers["retry-after"] == "60"
    assert "exceeded quota" in refused.value.message
