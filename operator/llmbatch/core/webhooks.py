"""Pure rules of batch webhooks: the event, its ids, the signature, the retry schedule, the record.

Deliveries follow Standard Webhooks exactly as OpenAI sends them, so that
``openai.OpenAI(webhook_secret=...).webhooks.unwrap(body, headers)`` verifies them:

- body: ``{"id": "evt_…", "object": "event", "type": "batch.completed", "created_at": <unix>,
  "data": {"id": "batch_…"}}`` (``created_at``: when the batch ended);
- headers ``webhook-id`` (``wh_…``, the same on every retry), ``webhook-timestamp`` (unix seconds
  of the attempt) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256>`` of
  ``"{webhook-id}.{timestamp}.{body}"``, keyed with the base64-decoded part of ``whsec_<base64>``).

No I/O here: the controller resolves, connects and writes (``llmbatch.controller.webhooks``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

from llmbatch.api.resources.webhook import WebhookEventType
from llmbatch.core.lifecycle import TERMINAL

EVENT_TYPES: tuple[WebhookEventType, ...] = get_args(WebhookEventType)
"""Every batch event type, in the order of the terminal statuses' documentation."""
DELIVERIES_ANNOTATION = "llmbatch.io/webhook-deliveries"
"""Annotation of a Batch holding its :class:`Deliveries` (JSON): survives operator restarts."""
MAX_ERROR = 512
"""Characters of an attempt's error kept on the record."""
MAX_ENDPOINTS = 64
"""Endpoints one event goes to at most (the first by name)."""
SIGNING_LABEL = "llmbatch.io/webhook-signing"
"""Label (value ``"true"``) of a Secret the operator may sign with. Where the operator may read
every Secret of a namespace (the chart's ``operator.webhooks.secretNamespaces``), a BatchWebhook's
``secretRef`` could otherwise make it use any of them, another application's credentials, as an
HMAC key: only a Secret labelled for it is one."""


def event_type(status: str | None) -> WebhookEventType | None:
    """The event a batch status announces (``completed`` → ``batch.completed``); None if none."""
    if status not in TERMINAL:
        return None
    wanted = f"batch.{status}"
    return next(t for t in EVENT_TYPES if t == wanted)


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.hexdigest()[:32]


def event_id(batch_uid: str, kind: str) -> str:
    """``evt_`` + 32 hex of the batch uid and the event type: one event, whoever receives it."""
    return "evt_" + _digest("evt", batch_uid, kind)


def webhook_id(batch_uid: str, endpoint_uid: str, kind: str) -> str:
    """``wh_`` + 32 hex of (batch, endpoint, type): the ``webhook-id`` of every retry."""
    return "wh_" + _digest("wh", batch_uid, endpoint_uid, kind)


class EventData(BaseModel):
    """The ``data`` of a batch event."""

    id: str
    """The batch's OpenAI id (``batch_…``)."""


class BatchEvent(BaseModel):
    """OpenAI's batch webhook event (``BatchCompletedWebhookEvent`` and its siblings)."""

    id: str
    """``evt_…``."""
    object: Literal["event"] = "event"
    """Always ``event``."""
    type: WebhookEventType
    """``batch.<terminal status>``."""
    created_at: int
    """Unix seconds: when the batch ended."""
    data: EventData
    """The batch."""

    def body(self) -> bytes:
        """The bytes sent and signed (compact JSON, fields in OpenAI's order)."""
        return orjson.dumps(self.model_dump(mode="json"))


def build_event(batch_id: str, batch_uid: str, kind: WebhookEventType, ended_at: int) -> BatchEvent:
    """The event announcing that the batch ``batch_id`` ended as ``kind`` at ``ended_at``."""
    return BatchEvent(
        id=event_id(batch_uid, kind), type=kind, created_at=ended_at, data=EventData(id=batch_id)
    )


# --- signing -----------------------------------------------------------------------------------


def unlabelled(namespace: str, name: str, labels: Mapping[str, str] | None) -> str | None:
    """Why the Secret ``namespace/name`` may not sign (it does not opt in), or None when it may."""
    if (labels or {}).get(SIGNING_LABEL) == "true":
        return None
    return (
        f"Secret {namespace}/{name} is not labelled {SIGNING_LABEL}=true: the operator signs only "
        f"with a Secret that carries it (kubectl label secret -n {namespace} {name} "
        f"{SIGNING_LABEL}=true)"
    )


def signing_key(secret: str) -> bytes:
    """The HMAC key of a secret: base64-decoded after ``whsec_``; other strings as UTF-8 bytes
    (what the SDK's verifier does). ValueError on a ``whsec_`` secret that is not base64."""
    secret = secret.strip()
    if not secret.startswith("whsec_"):
        if not secret:
            raise ValueError("the signing secret is empty")
        return secret.encode("utf-8")
    try:
        key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error as exc:
        raise ValueError("the signing secret is not whsec_<base64>") from exc
    if not key:
        raise ValueError("the signing secret is empty")
    return key


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The headers of one attempt (the timestamp is the attempt's, the id the delivery's)."""
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, msg_id, timestamp, body),
    }


# --- retries -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``base * 2**(n-1)`` after the n-th failure, capped, minus up to 10 %
    jitter derived from the webhook id (spreads endpoints, stays reproducible), for at least
    ``retry_for`` seconds after the first attempt."""

    base: float = 5.0
    """Seconds before the first retry."""
    cap: float = 3600.0
    """Longest wait between two attempts."""
    retry_for: float = 86400.0
    """A failed attempt this long after the first is the last one (at-least-once for 24 h)."""
    disabled_recheck: float = 60.0
    """Seconds between looks at a delivery whose endpoint is disabled."""


def retry_delay(policy: RetryPolicy, failures: int, msg_id: str) -> float:
    """Seconds to wait after the ``failures``-th failed attempt of delivery ``msg_id``."""
    exponent = min(max(failures, 1) - 1, 60)
    delay = min(policy.base * 2.0**exponent, policy.cap)
    jitter = int(_digest("jitter", msg_id, str(failures))[:4], 16) / 0xFFFF * 0.1
    return delay * (1.0 - jitter)


# --- the record kept on the Batch --------------------------------------------------------------

State = Literal["Pending", "Delivered", "GivenUp", "Abandoned"]
"""Pending: to be attempted at ``nextAttemptAt``. Delivered: a 2xx answer. GivenUp: failed for the
whole retry period. Abandoned: the endpoint was deleted."""


class _Record(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class Delivery(_Record):
    """One event to one endpoint."""

    webhook: str
    """BatchWebhook name (same namespace)."""
    webhook_uid: str
    """Its uid when the delivery was planned (a recreated endpoint of that name is another)."""
    webhook_id: str
    """The ``webhook-id`` header."""
    state: State = "Pending"
    """Where the delivery stands."""
    attempts: int = 0
    """Attempts made."""
    planned_at: float
    """Unix seconds when the delivery was planned; the retry period counts from the first
    attempt, which is due then."""
    first_attempt_at: float | None = None
    """Unix seconds of the first attempt."""
    next_attempt_at: float
    """Unix seconds when a Pending delivery is due."""
    last_attempt_at: float | None = None
    """Unix seconds of the last attempt."""
    last_error: Annotated[str, StringConstraints(max_length=MAX_ERROR)] | None = None
    """The last failure (HTTP status and body start, or the network error)."""
    delivered_at: float | None = None
    """Unix seconds of the 2xx answer."""


class Deliveries(_Record):
    """Every delivery of a batch's end event, kept in the Batch's annotation."""

    type: WebhookEventType
    """The event type."""
    event_id: str
    """The event's ``id``."""
    created_at: int
    """The event's ``created_at`` (when the batch ended)."""
    deliveries: Annotated[list[Delivery], Field(max_length=MAX_ENDPOINTS)]
    """One per endpoint that wanted the event."""

    def to_annotation(self) -> str:
        """The annotation value (compact JSON, camelCase)."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    def pending(self) -> list[Delivery]:
        """Deliveries still to be attempted."""
        return [d for d in self.deliveries if d.state == "Pending"]

    def next_due(self) -> float | None:
        """When the earliest pending delivery is due; None when none is pending."""
        return min((d.next_attempt_at for d in self.pending()), default=None)


def plan(
    batch_uid: str, kind: WebhookEventType, endpoints: list[tuple[str, str]], now: float
) -> list[Delivery]:
    """Pending deliveries to each (name, uid) endpoint, due now."""
    return [
        Delivery(
            webhook=name,
            webhook_uid=uid,
            webhook_id=webhook_id(batch_uid, uid, kind),
            planned_at=now,
            next_attempt_at=now,
        )
        for name, uid in endpoints
    ]


def wants(events: Sequence[str] | None, kind: str, created_at: float, ended_at: float) -> bool:
    """Whether an endpoint receives an event: it asked for the type (None: every type) and it
    existed when the batch ended (a new endpoint hears of batches ending from then on)."""
    return (events is None or kind in events) and created_at <= ended_at


def _first(delivery: Delivery, otherwise: float) -> float:
    return otherwise if delivery.first_attempt_at is None else delivery.first_attempt_at


def owed(policy: RetryPolicy, ended_at: float, now: float) -> bool:
    """Whether a batch that ended at ``ended_at`` and has no deliveries yet still gets them: not
    once its event is older than the retry period (an operator that was down for longer, or a
    batch that ended before webhooks were set up, sends nothing new)."""
    return now - ended_at < policy.retry_for


def after_success(delivery: Delivery, now: float) -> Delivery:
    """The record after a 2xx answer."""
    return delivery.model_copy(
        update={
            "state": "Delivered",
            "attempts": delivery.attempts + 1,
            "first_attempt_at": _first(delivery, now),
            "last_attempt_at": now,
            "delivered_at": now,
        }
    )


def after_failure(policy: RetryPolicy, delivery: Delivery, error: str, now: float) -> Delivery:
    """The record after a failed attempt: due again after the backoff, or given up when the
    attempt came ``retry_for`` seconds or more after the first."""
    first = _first(delivery, now)
    attempts = delivery.attempts + 1
    given_up = now - first >= policy.retry_for
    return delivery.model_copy(
        update={
            "state": "GivenUp" if given_up else "Pending",
            "attempts": attempts,
            "first_attempt_at": first,
            "last_attempt_at": now,
            "last_error": error[:MAX_ERROR],
            "next_attempt_at": now + retry_delay(policy, attempts, delivery.webhook_id),
        }
    )


def while_disabled(policy: RetryPolicy, delivery: Delivery, now: float) -> Delivery:
    """The record when its endpoint is disabled: looked at again later, or given up when the
    retry period (counted from when it was planned) is over."""
    if now - _first(delivery, delivery.planned_at) >= policy.retry_for:
        error = "the endpoint stayed disabled for the whole retry period"
        return delivery.model_copy(update={"state": "GivenUp", "last_error": error})
    return delivery.model_copy(update={"next_attempt_at": now + policy.disabled_recheck})


def abandoned(delivery: Delivery, why: str) -> Delivery:
    """The record when its endpoint is gone."""
    return delivery.model_copy(update={"state": "Abandoned", "last_error": why[:MAX_ERROR]})


def summary(deliveries: Deliveries) -> tuple[bool, str, str]:
    """The Batch's ``WebhooksDelivered`` condition: (status, reason, message)."""
    states = {d.state for d in deliveries.deliveries}
    if states == {"Delivered"}:
        reason = "Delivered"
    elif "Pending" in states:
        reason = "Retrying" if any(d.attempts for d in deliveries.pending()) else "Pending"
    else:
        reason = "GivenUp" if "GivenUp" in states else "Abandoned"
    lines = [f"{deliveries.type} ({deliveries.event_id}):"]
    for d in deliveries.deliveries:
        line = f"{d.webhook}: {d.state}, {d.attempts} attempt(s), webhook-id {d.webhook_id}"
        if d.state == "Pending" and d.attempts:
            line += f", next in {max(0, round(d.next_attempt_at - (d.last_attempt_at or 0)))}s"
        if d.last_error and d.state != "Delivered":
            line += f", last error: {d.last_error}"
        lines.append(line)
    return reason == "Delivered", reason, "\n".join(lines)
