"""The operator signs only with a Secret labelled for it (``llmbatch.io/webhook-signing: "true"``).

Where the chart lets the operator read every Secret of a namespace, a BatchWebhook's ``secretRef``
could otherwise name any of them — another application's credentials — and have the operator use
it as an HMAC key. The configuration check and every delivery go through the real
:class:`WebhookIO` over the shared fake API; the endpoint is a real listener on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from llmbatch.controller.config import WebhookConfig
from llmbatch.controller.webhooks import WebhookDispatcher, deliveries_of
from llmbatch.controller.webhooks.check import check
from llmbatch.controller.webhooks.kubeio import WebhookIO
from llmbatch.core import webhooks as rules
from llmbatch.core.lifecycle import unix_seconds
from llmbatch.core.netguard import parse_networks
from tests.fixtures.fakekube import FakeKube
from tests.fixtures.webhooks import listen

SECRET = "whsec_" + base64.b64encode(b"a signing key of 32 bytes length").decode()
CREATED = "2027-01-15T08:00:00Z"
ENDED = unix_seconds(CREATED) + 60
LABEL = f"{rules.SIGNING_LABEL}=true"


def add_secret(kube: FakeKube, labels: dict[str, str] | None) -> dict[str, Any]:
    data = {"secret": base64.b64encode(SECRET.encode()).decode()}
    meta = {"namespace": "t", "name": "signing", "labels": labels or {}}
    return kube.add("secrets", {"metadata": meta, "data": data})


def add_webhook(kube: FakeKube, url: str) -> dict[str, Any]:
    spec = {"url": url, "secretRef": {"name": "signing"}}
    meta = {"namespace": "t", "name": "hook", "creationTimestamp": CREATED}
    return kube.add("batchwebhooks", {"metadata": meta, "spec": spec})


def ready(kube: FakeKube) -> dict[str, Any]:
    hook = kube.get("batchwebhooks", "t", "hook") or {}
    (condition,) = [c for c in hook["status"]["conditions"] if c["type"] == "Ready"]
    return condition


def run_check(kube: FakeKube, hook: dict[str, Any]) -> dict[str, Any]:
    asyncio.run(check(WebhookIO(kube), hook, (), 2.0))  # type: ignore[arg-type]
    return ready(kube)


def test_an_unlabelled_secret_fails_the_check_and_the_condition_names_the_label() -> None:
    for labels in (None, {rules.SIGNING_LABEL: "false"}, {"app": "payments"}):
        kube = FakeKube()
        add_secret(kube, labels)
        condition = run_check(kube, add_webhook(kube, "https://93.184.216.34/hook"))
        assert (condition["status"], condition["reason"]) == ("False", "ConfigError")
        assert LABEL in condition["message"]
        assert "t/signing" in condition["message"]


def test_a_labelled_secret_passes_the_check() -> None:
    kube = FakeKube()
    add_secret(kube, {rules.SIGNING_LABEL: "true"})
    condition = run_check(kube, add_webhook(kube, "https://93.184.216.34/hook"))
    assert (condition["status"], condition["reason"]) == ("True", "Configured")


def test_a_missing_secret_still_says_so() -> None:
    kube = FakeKube()
    condition = run_check(kube, add_webhook(kube, "https://93.184.216.34/hook"))
    assert (condition["reason"], "does not exist" in condition["message"]) == ("ConfigError", True)


# --- deliveries ----------------------------------------------------------------------------------


def add_batch(kube: FakeKube) -> None:
    meta = {"namespace": "t", "name": "batch-1", "uid": "batch-uid"}
    kube.add("batches", {"metadata": meta, "status": {"status": "completed", "completedAt": ENDED}})


def test_no_delivery_is_attempted_until_the_secret_is_labelled() -> None:
    kube = FakeKube()
    secret = add_secret(kube, None)
    add_batch(kube)
    clock = [float(ENDED)]
    config = WebhookConfig(allowed_networks=parse_networks("127.0.0.0/8"), timeout=2.0)

    async def scenario() -> tuple[list[Any], list[bytes]]:
        runner, port, seen = await listen()
        add_webhook(kube, f"http://127.0.0.1:{port}/hook")
        dispatcher = WebhookDispatcher(kube, config, clock=lambda: clock[0])  # type: ignore[arg-type]
        try:
            await dispatcher.process("t", "batch-1")
            assert seen == []  # nothing sent, not even unsigned
            assert ready(kube)["reason"] == "ConfigError"
            assert LABEL in ready(kube)["message"]
            secret["metadata"]["labels"] = {rules.SIGNING_LABEL: "true"}
            clock[0] += config.retry.cap  # past the backoff
            await dispatcher.process("t", "batch-1")
            bodies = [await request.read() for request in seen]
        finally:
            await dispatcher.sender.close()
            await runner.cleanup()
        return seen, bodies

    seen, bodies = asyncio.run(scenario())
    recorded = deliveries_of(kube.get("batches", "t", "batch-1") or {})
    assert recorded is not None
    (delivery,) = recorded.deliveries
    assert (delivery.state, delivery.attempts) == ("Delivered", 2)
    assert ready(kube)["reason"] == "Delivered"
    headers = seen[0].headers
    key = rules.signing_key(SECRET)
    signed = rules.sign(key, headers["webhook-id"], int(headers["webhook-timestamp"]), bodies[0])
    assert headers["webhook-signature"] == signed
