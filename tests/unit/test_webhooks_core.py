"""The pure rules of batch webhooks: event body, ids, signature (checked by the openai SDK's own
verifier), retry schedule and the delivery record."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import openai
import pytest
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from llmbatch.api.resources import WebhookEventType
from llmbatch.core import webhooks as rules

SECRET = "whsec_" + base64.b64encode(b"a signing key of 32 bytes length").decode()
UID = "0b7a3c1e-1111-4a4a-9c9c-123456789abc"


def sdk(secret: str = SECRET) -> openai.OpenAI:
    return openai.OpenAI(api_key="x", webhook_secret=secret, base_url="http://127.0.0.1:9/v1")


@pytest.mark.parametrize(
    ("status", "model"),
    [
        ("completed", BatchCompletedWebhookEvent),
        ("failed", BatchFailedWebhookEvent),
        ("expired", BatchExpiredWebhookEvent),
        ("cancelled", BatchCancelledWebhookEvent),
    ],
)
def test_the_sdk_verifies_and_parses_every_batch_event(status: str, model: type[Any]) -> None:
    kind = rules.event_type(status)
    assert kind == f"batch.{status}"
    event = rules.build_event("batch_abc", UID, kind, 1_700_000_000)
    body = event.body()
    msg_id = rules.webhook_id(UID, "endpoint-uid", kind)
    headers = rules.signed_headers(rules.signing_key(SECRET), msg_id, int(time.time()), body)
    parsed: Any = sdk().webhooks.unwrap(body, headers)
    assert isinstance(parsed, model)
    assert parsed.id == rules.event_id(UID, kind)
    assert parsed.id.startswith("evt_")
    assert parsed.data.id == "batch_abc"
    assert parsed.created_at == 1_700_000_000
    assert parsed.object == "event"
    assert json.loads(body) == {
        "id": parsed.id,
        "object": "event",
        "type": kind,
        "created_at": 1_700_000_000,
        "data": {"id": "batch_abc"},
    }


def test_the_sdk_refuses_a_wrong_secret_a_changed_body_and_an_old_timestamp() -> None:
    kind: WebhookEventType = "batch.completed"
    body = rules.build_event("batch_abc", UID, kind, 1).body()
    key = rules.signing_key(SECRET)
    now = int(time.time())
    headers = rules.signed_headers(key, "wh_1", now, body)
    other = "whsec_" + base64.b64encode(b"another key").decode()
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk(other).webhooks.unwrap(body, headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(body.replace(b"batch_abc", b"batch_abd"), headers)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(body, rules.signed_headers(key, "wh_1", now - 3600, body))
    with pytest.raises(openai.InvalidWebhookSignatureError):
        sdk().webhooks.unwrap(body, {**headers, "webhook-id": "wh_2"})


def test_signature_is_standard_webhooks_v1() -> None:
    # The example of the Standard Webhooks specification (secret, id, timestamp, payload).
    key = rules.signing_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    body = b'{"test": 2432232314}'
    signature = rules.sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signing_key_forms() -> None:
    assert rules.signing_key("whsec_" + base64.b64encode(b"k").decode()) == b"k"
    assert rules.signing_key("plain-secret") == b"plain-secret"  # what the SDK does too
    for bad in ("whsec_***", "whsec_", "", "  "):
        with pytest.raises(ValueError):
            rules.signing_key(bad)


def test_ids_are_deterministic_per_batch_endpoint_and_type() -> None:
    one = rules.webhook_id(UID, "e1", "batch.completed")
    assert one == rules.webhook_id(UID, "e1", "batch.completed")
    assert one.startswith("wh_")
    assert len(one) == 3 + 32
    assert len({one, rules.webhook_id(UID, "e2", "batch.completed")}) == 2
    assert rules.webhook_id(UID, "e1", "batch.failed") != one
    assert rules.event_id(UID, "batch.completed") != rules.event_id(UID, "batch.failed")
    assert rules.event_type("in_progress") is None
    assert rules.event_type(None) is None


def test_backoff_doubles_to_the_cap_with_bounded_jitter() -> None:
    policy = rules.RetryPolicy(base=5, cap=3600, retry_for=86400)
    delays = [rules.retry_delay(policy, n, "wh_x") for n in range(1, 16)]
    for n, delay in enumerate(delays, start=1):
        nominal = min(5 * 2 ** (n - 1), 3600)
        assert 0.9 * nominal <= delay <= nominal, (n, delay)
    assert delays == [rules.retry_delay(policy, n, "wh_x") for n in range(1, 16)]


def test_failures_retry_for_the_whole_period_then_give_up() -> None:
    policy = rules.RetryPolicy(base=5, cap=3600, retry_for=86400)
    (delivery,) = rules.plan(UID, "batch.completed", [("hook", "uid-1")], now=1000.0)
    now = 1000.0
    while delivery.state == "Pending":
        assert delivery.next_attempt_at >= now
        now = delivery.next_attempt_at
        delivery = rules.after_failure(policy, delivery, "HTTP 500", now)
    assert delivery.state == "GivenUp"
    assert delivery.last_attempt_at is not None
    assert delivery.last_attempt_at - 1000.0 >= 86400  # retried for at least 24 h
    assert delivery.last_attempt_at - 1000.0 < 86400 + 3600
    assert 24 <= delivery.attempts <= 40, delivery.attempts
    assert delivery.webhook_id == rules.webhook_id(UID, "uid-1", "batch.completed")


def test_success_and_disabled_and_deleted_records() -> None:
    policy = rules.RetryPolicy(base=1, cap=10, retry_for=100)
    (delivery,) = rules.plan(UID, "batch.failed", [("hook", "uid-1")], now=0.0)
    failed = rules.after_failure(policy, delivery, "HTTP 503: busy", 0.0)
    done = rules.after_success(failed, 2.0)
    assert (done.state, done.attempts, done.delivered_at, done.first_attempt_at) == (
        "Delivered",
        2,
        2.0,
        0.0,
    )
    waiting = rules.while_disabled(policy, delivery, 50.0)
    assert waiting.state == "Pending"
    assert waiting.next_attempt_at == 50.0 + policy.disabled_recheck
    assert rules.while_disabled(policy, delivery, 100.0).state == "GivenUp"
    assert rules.abandoned(delivery, "gone").state == "Abandoned"


def test_a_new_endpoint_hears_of_batches_ending_after_it_was_created() -> None:
    assert rules.wants(None, "batch.completed", created_at=10, ended_at=10)
    assert not rules.wants(None, "batch.completed", created_at=11, ended_at=10)
    assert rules.wants(["batch.failed"], "batch.failed", 0, 10)
    assert not rules.wants(["batch.failed"], "batch.completed", 0, 10)


def test_annotation_round_trip_and_summary() -> None:
    policy = rules.RetryPolicy(base=4, cap=10, retry_for=100)
    planned = rules.plan(UID, "batch.completed", [("a", "u1"), ("b", "u2")], now=0.0)
    deliveries = rules.Deliveries(
        type="batch.completed",
        event_id=rules.event_id(UID, "batch.completed"),
        created_at=5,
        deliveries=[rules.after_success(planned[0], 1.0), planned[1]],
    )
    again = rules.Deliveries.model_validate_json(deliveries.to_annotation())
    assert again == deliveries
    assert "webhookId" in deliveries.to_annotation()
    assert rules.summary(deliveries)[:2] == (False, "Pending")
    retrying = deliveries.model_copy(
        update={
            "deliveries": [
                deliveries.deliveries[0],
                rules.after_failure(policy, planned[1], "HTTP 500", 1.0),
            ]
        }
    )
    ok, reason, message = rules.summary(retrying)
    assert (ok, reason) == (False, "Retrying")
    assert "b: Pending, 1 attempt(s)" in message
    assert "last error: HTTP 500" in message
    assert retrying.next_due() == pytest.approx(
        1.0 + rules.retry_delay(policy, 1, planned[1].webhook_id)
    )
    delivered = retrying.model_copy(
        update={"deliveries": [deliveries.deliveries[0], rules.after_success(planned[1], 9.0)]}
    )
    assert rules.summary(delivered)[:2] == (True, "Delivered")
    assert delivered.next_due() is None


def test_an_event_older_than_the_retry_period_is_not_owed() -> None:
    policy = rules.RetryPolicy(retry_for=86400)
    assert rules.owed(policy, ended_at=1000, now=1000 + 86399)
    assert not rules.owed(policy, ended_at=1000, now=1000 + 86400)
