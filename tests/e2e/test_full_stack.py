"""The whole stack: the official ``openai`` SDK → gateway → Batch objects → operator → warm slot
running the real vLLM CPU engine on SmolLM2 → output file back through the SDK, and the signed
webhook that says the batch ended, verified by the SDK.

Nothing is simulated: the control plane, node agent, operator, gateway and executor are the
real processes, sharing a filesystem store as they would share a bucket in a cluster.
"""

from __future__ import annotations

import json
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from openai.types.webhooks import BatchCompletedWebhookEvent

from llmbatch.executor.models import MODELS
from tests.e2e.stack import prepared_pool, serving
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.operator import ClusterCLI, OperatorProcess
from tests.integration.test_operator import wait_for
from tests.integration.test_webhooks import (
    SECRET,
    SETTINGS,
    Receiver,
    operator_settings,
    receiver,  # noqa: F401  (the local webhook receiver fixture)
    register,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SEED_TICKETS = {
    "ticket-1": "I cannot sign in.",
    "ticket-2": "Please send a copy of my invoice.",
}


@pytest.fixture(scope="module")
def stack(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, str, str]]:
    """A gateway sharing the operator's store, a SmolLM2 vLLM pool and a tenant with a key."""
    pool = prepared_pool("smollm2")
    with serving(cluster, operator_process, tmp_path_factory.mktemp("e2e-gateway"), pool) as up:
        yield up


def test_seed_000_through_the_sdk(
    stack: tuple[GatewayProcess, str, str],
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tmp_path: pathlib.Path,
) -> None:
    gateway, key, _ = stack
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    rows = [
        {
            "custom_id": ticket_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "smollm2",
                "messages": [{"role": "user", "content": "Summarize: " + text}],
                "max_completion_tokens": 48,
            },
        }
        for ticket_id, text in SEED_TICKETS.items()
    ]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with source.open("rb") as handle:
        uploaded = client.files.create(file=handle, purpose="batch")
    assert uploaded.purpose == "batch"
    assert uploaded.bytes == source.stat().st_size

    headers = {"Idempotency-Key": f"e2e-{uuid.uuid4().hex}"}
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=headers,
    )
    assert batch.status == "validating"
    again = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=headers,
    )
    assert again.id == batch.id  # a retried create never makes a second batch

    deadline = time.monotonic() + 600
    seen: list[str] = []
    while True:
        current = client.batches.retrieve(batch.id)
        if not seen or seen[-1] != current.status:
            seen.append(current.status)
        if current.status in {"completed", "failed", "expired", "cancelled"}:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"batch stuck in {current.status}: {seen}\n{operator_process.logs()}")
        time.sleep(2)
    assert current.status == "completed", (current, operator_process.logs())
    # the model id the rows name (listed, usable), and the revision acceptance pinned beside it
    # (the demo pool's: the prepared folder's)
    assert current.model == "smollm2"
    assert current.model in {m.id for m in client.models.list().data}
    pinned = MODELS["smollm2"].folder().name.removeprefix("smollm2-")
    assert (current.model_extra or {})["model_revision"] == pinned
    assert seen[0] in ("validating", "in_progress")
    assert current.request_counts is not None
    assert current.request_counts.completed == 2
    assert current.request_counts.failed == 0
    assert current.output_file_id
    assert current.error_file_id is None
    assert current.usage is not None
    assert current.usage.output_tokens > 0

    lines = [
        json.loads(line) for line in client.files.content(current.output_file_id).text.splitlines()
    ]
    assert sorted(line["custom_id"] for line in lines) == sorted(SEED_TICKETS)
    answers: dict[str, Any] = {}
    for line in lines:
        assert line["error"] is None
        assert line["id"].startswith("batch_req_")
        assert line["response"]["status_code"] == 200
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "smollm2"
        answers[line["custom_id"]] = completion.choices[0].message.content
    assert all(answers.values()), answers
    total_out = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    assert current.usage.output_tokens == total_out  # billed once, from the final output

    printed = cluster.kubectl("get", "batches", "-A")
    assert "completed" in printed


def test_responses_batch_and_its_signed_webhook_through_the_sdk(
    stack: tuple[GatewayProcess, str, str],
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    receiver: Receiver,  # noqa: F811  (the fixture imported above)
    tmp_path: pathlib.Path,
) -> None:
    """#16 item 5: the SDK creates a ``/v1/responses`` batch, a local receiver gets the signed
    ``batch.completed`` event, ``client.webhooks.unwrap`` verifies it, and every output line
    parses as the SDK's own ``Response``."""
    gateway, key, namespace = stack
    register(cluster, tmp_path, namespace, receiver.url("/hooks/batches"))
    client = openai.OpenAI(
        base_url=gateway.base_url + "/v1", api_key=key, webhook_secret=SECRET, max_retries=0
    )
    rows = [
        {
            "custom_id": f"resp-{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "smollm2", "input": prompt, "max_output_tokens": 24},
        }
        for i, prompt in enumerate(["Say hello.", "Name a colour."])
    ]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    with operator_settings(operator_process, SETTINGS):  # loopback receivers allowed
        uploaded = client.files.create(file=("responses.jsonl", data), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
        )
        assert batch.endpoint == "/v1/responses"

        # This batch's event only: the first test's batch may have ended in the second this
        # endpoint was created, and an endpoint hears of batches that ended from the second it
        # was created (core.webhooks.wants: whole seconds, a tie counts), so on a slow machine,
        # where the operator sends that event after this registration, it arrived first.
        def signed_event() -> Any:
            got = receiver.on("/hooks/batches")
            ours = [r for r in got if json.loads(r.body)["data"]["id"] == batch.id]
            return ours[0] if ours else None

        received = wait_for(signed_event, 600, "the batch.completed webhook", operator_process.logs)
    event = client.webhooks.unwrap(received.body, received.headers)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == batch.id
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="x", webhook_secret=SECRET[:-4] + "AAA=").webhooks.unwrap(
            received.body, received.headers
        )
    done = client.batches.retrieve(event.data.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 0)
    assert done.output_file_id
    lines = [json.loads(raw) for raw in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in lines) == ["resp-0", "resp-1"]
    output_tokens = 0
    for line in lines:
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        response = Response.model_validate(line["response"]["body"])
        assert response.model == "smollm2"
        assert response.output_text
        assert response.usage is not None
        output_tokens += response.usage.output_tokens
    assert done.usage is not None
    assert done.usage.output_tokens == output_tokens  # billed once, from the final output
