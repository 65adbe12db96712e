"""Signed batch webhooks on the real control plane with the real operator (docs/webhooks.md).

A local HTTP receiver stands for the tenant's endpoint; the operator is restarted with loopback
allowed (``LLMBATCH_WEBHOOK_ALLOWED_NETWORKS``: by default it refuses non-public addresses) and a
short backoff. Every event is verified with the openai SDK's own ``webhooks.unwrap``.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import pathlib
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from openai.types.webhooks import BatchCancelledWebhookEvent, BatchCompletedWebhookEvent

from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.webhooks import DELIVERIES_ANNOTATION, SIGNING_LABEL
from tests.fixtures.operator import OperatorProcess
from tests.integration.test_operator import (
    apply,
    chat_requests,
    get_batch,
    kubectl_json,
    make_batch,
    make_pool,
    wait_for,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
SECRET = "whsec_" + base64.b64encode(b"webhook test key, 32 bytes long!").decode()
SIGNING = {SIGNING_LABEL: "true"}
"""The label that lets the operator sign with a Secret."""
SETTINGS = {
    "LLMBATCH_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
    "LLMBATCH_WEBHOOK_RETRY_BASE": "1",
    "LLMBATCH_WEBHOOK_RETRY_MAX": "4",
    "LLMBATCH_WEBHOOK_TIMEOUT": "5",
}


@dataclass
class Received:
    """One POST the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    """A local endpoint: answers ``fail[path]`` times 500 on a path, then 200."""

    port: int = 0
    fail: dict[str, int] = field(default_factory=dict)
    got: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.got if r.path == path]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with state.lock:
                left = state.fail.get(self.path, 0)
                state.fail[self.path] = max(0, left - 1)
                code = 500 if left else 200
                headers = {k.lower(): v for k, v in self.headers.items()}
                state.got.append(Received(self.path, headers, body, code))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"not now" if code == 500 else b"ok")

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def operator_settings(operator: OperatorProcess, settings: dict[str, str]) -> Iterator[None]:
    """The operator restarted with ``settings`` in its environment, and again without them."""
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    operator.restart()
    wait_for(_metrics_up(operator), 60, "operator metrics", operator.logs)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        operator.restart()
        wait_for(_metrics_up(operator), 60, "operator metrics", operator.logs)


@pytest.fixture(scope="module")
def webhook_operator(operator_process: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session's operator, restarted with loopback allowed and short retries."""
    with operator_settings(operator_process, SETTINGS):
        yield operator_process


def _metrics_up(operator: OperatorProcess) -> Any:
    def check() -> bool:
        try:
            return "llmbatch_webhook_deliveries_total" in operator.metrics()
        except OSError:
            return False

    return check


def register(
    cluster: Any,
    tmp_path: pathlib.Path,
    namespace: str,
    url: str,
    events: list[str] | None = None,
) -> str:
    """A Secret and a BatchWebhook, the way a tenant applies them with kubectl."""
    name = f"hook-{uuid.uuid4().hex[:6]}"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": f"{name}-signing", "namespace": namespace, "labels": SIGNING},
        "stringData": {"secret": SECRET},
    }
    spec: dict[str, Any] = {"url": url, "secretRef": {"name": f"{name}-signing"}}
    if events:
        spec["events"] = events
    hook = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchWebhook",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    apply(cluster, tmp_path, secret)
    apply(cluster, tmp_path, hook)
    return name


def verified(received: Received) -> Any:
    """The event as the openai SDK verifies and parses it."""
    client = openai.OpenAI(api_key="x", webhook_secret=SECRET, base_url="http://127.0.0.1:9/v1")
    return client.webhooks.unwrap(received.body, received.headers)


def condition(batch: dict[str, Any], kind: str) -> dict[str, Any] | None:
    found = [c for c in (batch.get("status") or {}).get("conditions") or [] if c["type"] == kind]
    return found[0] if found else None


def delivered_condition(cluster: Any, namespace: str, name: str) -> Any:
    def check() -> Any:
        cond = condition(get_batch(cluster, namespace, name), "WebhooksDelivered")
        return cond if cond and cond["status"] == "True" else None

    return check


def describe(cluster: Any, namespace: str, name: str, *reasons: str) -> str:
    """``kubectl describe batch`` once it shows Events of every reason given (they are posted
    after the delivery state is written)."""

    def check() -> str | None:
        out: str = cluster.kubectl("describe", "batch", name, "-n", namespace)
        return out if all(reason in out for reason in reasons) else None

    text: str = wait_for(check, 30, f"events {reasons}")
    return text


def metric(operator: OperatorProcess, series: str) -> float:
    for line in operator.metrics().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not exported")


# --- tests -------------------------------------------------------------------------------------


def test_a_completed_batch_sends_one_signed_event_the_sdk_verifies(
    cluster: Any,
    namespace: str,
    webhook_operator: OperatorProcess,
    receiver: Receiver,
    tmp_path: pathlib.Path,
) -> None:
    hook = register(cluster, tmp_path, namespace, receiver.url("/done"))
    register(cluster, tmp_path, namespace, receiver.url("/failures"), events=["batch.failed"])
    pool = make_pool(cluster, tmp_path)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(5))
    batch = wait_status(cluster, webhook_operator, namespace, name, {"completed", "failed"})
    assert batch["status"]["status"] == "completed"
    wait_for(lambda: receiver.on("/done"), 60, "the webhook", webhook_operator.logs)
    wait_for(delivered_condition(cluster, namespace, name), 30, "WebhooksDelivered")

    (got,) = receiver.on("/done")
    event = verified(got)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.type == "batch.completed"
    assert event.object == "event"
    assert event.data.id == batch_id_from_name(name)
    assert event.created_at == batch["status"]["completedAt"]
    assert event.id.startswith("evt_")
    assert got.headers["webhook-id"].startswith("wh_")
    assert got.headers["content-type"] == "application/json"
    assert receiver.on("/failures") == []  # it asked for batch.failed only

    record = json.loads(get_batch(cluster, namespace, name)["metadata"]["annotations"][
        DELIVERIES_ANNOTATION
    ])  # fmt: skip
    assert record["eventId"] == event.id
    assert [(d["webhook"], d["state"], d["attempts"]) for d in record["deliveries"]] == [
        (hook, "Delivered", 1)
    ]
    status = kubectl_json(cluster, "get", "batchwebhook", hook, "-n", namespace)["status"]
    assert status["delivered"] == 1
    assert status.get("failedAttempts", 0) == 0
    describe(cluster, namespace, name, "WebhookDelivered")
    assert metric(webhook_operator, 'llmbatch_webhook_deliveries_total{outcome="delivered"}') >= 1
    time.sleep(3)  # nothing more arrives: one event per endpoint
    assert len(receiver.on("/done")) == 1


def test_a_failing_receiver_gets_the_event_later_with_the_same_webhook_id(
    cluster: Any,
    namespace: str,
    webhook_operator: OperatorProcess,
    receiver: Receiver,
    tmp_path: pathlib.Path,
) -> None:
    receiver.fail["/flaky"] = 3
    hook = register(cluster, tmp_path, namespace, receiver.url("/flaky"))
    pool = make_pool(cluster, tmp_path)
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(3))
    wait_status(cluster, webhook_operator, namespace, name, {"completed"})

    def recorded() -> bool:
        annotations = get_batch(cluster, namespace, name)["metadata"].get("annotations") or {}
        record = json.loads(annotations.get(DELIVERIES_ANNOTATION) or '{"deliveries": []}')
        return any(d["attempts"] for d in record["deliveries"])

    wait_for(recorded, 60, "a first attempt recorded", webhook_operator.logs)
    # Delivery state lives on the Batch: a crashed operator carries on where it stopped.
    webhook_operator.restart()
    wait_for(
        lambda: [r for r in receiver.on("/flaky") if r.answered == 200],
        90,
        "a successful attempt",
        webhook_operator.logs,
    )
    attempts = receiver.on("/flaky")
    assert len(attempts) >= 4
    assert [r.answered for r in attempts[:3]] == [500, 500, 500]
    assert len({r.headers["webhook-id"] for r in attempts}) == 1
    assert len({r.body for r in attempts}) == 1  # the same event, re-signed per attempt
    for received in attempts:
        assert isinstance(verified(received), BatchCompletedWebhookEvent)
    wait_for(delivered_condition(cluster, namespace, name), 30, "WebhooksDelivered")
    status = kubectl_json(cluster, "get", "batchwebhook", hook, "-n", namespace)["status"]
    assert status["delivered"] == 1
    # An attempt in flight when the operator was killed is sent again but never counted.
    failures = len([r for r in attempts if r.answered == 500])
    assert failures - 1 <= status["failedAttempts"] <= failures
    assert "HTTP 500" in status["lastError"]
    describe(cluster, namespace, name, "WebhookAttemptFailed", "WebhookDelivered")


def test_a_cancelled_batch_sends_batch_cancelled_and_metadata_is_refused(
    cluster: Any,
    namespace: str,
    webhook_operator: OperatorProcess,
    receiver: Receiver,
    tmp_path: pathlib.Path,
) -> None:
    register(cluster, tmp_path, namespace, receiver.url("/cancel"))
    metadata_hook = register(cluster, tmp_path, namespace, "http://169.254.169.254/latest")
    pool = make_pool(cluster, tmp_path, engine_args=["--latency-seconds=2", "--max-num-seqs=1"])
    name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(20))
    cluster.kubectl(
        "patch", "batch", name, "-n", namespace, "--type=merge", "-p", '{"spec":{"cancel":true}}'
    )
    batch = wait_status(cluster, webhook_operator, namespace, name, {"cancelled"}, timeout=120)
    wait_for(lambda: receiver.on("/cancel"), 60, "the webhook", webhook_operator.logs)
    event = verified(receiver.on("/cancel")[0])
    assert isinstance(event, BatchCancelledWebhookEvent)
    assert event.data.id == batch_id_from_name(name)
    assert event.created_at == batch["status"]["cancelledAt"]

    def refused() -> Any:
        obj = kubectl_json(cluster, "get", "batchwebhook", metadata_hook, "-n", namespace)
        return obj.get("status") if (obj.get("status") or {}).get("failedAttempts") else None

    status = wait_for(refused, 30, "a refused attempt", webhook_operator.logs)
    assert "refused" in status["lastError"]
    assert "metadata" in status["lastError"]
    ready = [c for c in status["conditions"] if c["type"] == "Ready"]
    assert ready
    assert ready[0]["status"] == "False"

    def retrying() -> Any:
        cond = condition(get_batch(cluster, namespace, name), "WebhooksDelivered")
        return cond if cond and cond["reason"] == "Retrying" else None

    cond = wait_for(retrying, 30, "WebhooksDelivered: Retrying", webhook_operator.logs)
    assert cond["status"] == "False"
    assert metadata_hook in cond["message"]


def test_a_new_endpoint_is_checked_before_any_delivery(
    cluster: Any,
    namespace: str,
    webhook_operator: OperatorProcess,
    receiver: Receiver,
    tmp_path: pathlib.Path,
) -> None:
    hook: dict[str, Any] = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchWebhook",
        "metadata": {"name": "unsigned", "namespace": namespace},
        "spec": {"url": receiver.url("/x"), "secretRef": {"name": "not-there"}},
    }
    apply(cluster, tmp_path, hook)

    def ready() -> Any:
        obj = kubectl_json(cluster, "get", "batchwebhook", "unsigned", "-n", namespace)
        conditions = (obj.get("status") or {}).get("conditions") or []
        found = [c for c in conditions if c["type"] == "Ready"]
        if found and found[0].get("observedGeneration") == obj["metadata"]["generation"]:
            return found[0]
        return None

    first = wait_for(ready, 30, "the check", webhook_operator.logs)
    assert (first["status"], first["reason"]) == ("False", "ConfigError")
    assert "not-there" in first["message"]
    assert "does not exist" in first["message"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "not-there", "namespace": namespace, "labels": SIGNING},
        "stringData": {"secret": SECRET},
    }
    apply(cluster, tmp_path, secret)
    apply(cluster, tmp_path, {**hook, "spec": {**hook["spec"], "events": ["batch.failed"]}})
    wait_for(
        lambda: (ready() or {}).get("reason") == "Configured", 30, "Ready", webhook_operator.logs
    )
    assert ready()["status"] == "True"
    assert receiver.got == []  # a check sends nothing


def test_an_endpoint_that_keeps_failing_is_given_up_with_a_warning(
    cluster: Any,
    namespace: str,
    webhook_operator: OperatorProcess,
    receiver: Receiver,
    tmp_path: pathlib.Path,
) -> None:
    receiver.fail["/dead"] = 1000
    hook = register(cluster, tmp_path, namespace, receiver.url("/dead"))
    pool = make_pool(cluster, tmp_path)
    # Retries for 4 s instead of 24 h (base 1 s, max 4 s: attempts at about 0, 1, 3 and 7 s).
    with operator_settings(webhook_operator, {**SETTINGS, "LLMBATCH_WEBHOOK_RETRY_FOR": "4"}):
        name = make_batch(cluster, tmp_path, namespace, pool=pool, requests=chat_requests(2))
        wait_status(cluster, webhook_operator, namespace, name, {"completed"})

        def given_up() -> Any:
            cond = condition(get_batch(cluster, namespace, name), "WebhooksDelivered")
            return cond if cond and cond["reason"] == "GivenUp" else None

        cond = wait_for(given_up, 60, "the delivery given up", webhook_operator.logs)
    assert cond["status"] == "False"
    attempts = receiver.on("/dead")
    assert len(attempts) >= 3
    assert len({r.headers["webhook-id"] for r in attempts}) == 1
    describe(cluster, namespace, name, "WebhookGivenUp")
    status = kubectl_json(cluster, "get", "batchwebhook", hook, "-n", namespace)["status"]
    assert status["givenUp"] == 1
    assert status["failedAttempts"] == len(attempts)
    time.sleep(3)  # given up: no attempt more
    assert len(receiver.on("/dead")) == len(attempts)
