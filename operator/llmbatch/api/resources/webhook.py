"""The BatchWebhook resource: an endpoint of a tenant that hears when its batches end.

The namespace is the tenant: every Batch of the namespace that ends (completed, failed, expired,
cancelled) sends one signed event to each BatchWebhook of the namespace that wants that event
type (docs/webhooks.md). Deliveries follow Standard Webhooks as OpenAI sends them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from llmbatch.api.resources.base import Conditions, CRModel
from llmbatch.api.resources.fields import DNSName, Text

WebhookEventType = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]
"""OpenAI's batch event types: the batch's terminal status after ``batch.``."""

_HOST = r"[\x21\x22\x24-\x2e\x30-\x3e\x41-\x7e]+"
"""The URL's host (and port): printable ASCII but ``#``, ``/``, ``?`` and ``@``. Never Unicode:
IDNA would fold full-width digits and dots into an IP address. Hex escapes and ranges only, the
syntax both Kubernetes (Go RE2) and pydantic (Rust regex) read the same."""

WebhookURL = Annotated[
    str,
    StringConstraints(max_length=2048, pattern=rf"^https?://([^\s/?#@]+@)?{_HOST}([/?#]\S*)?$"),
]
"""An absolute http(s) URL without whitespace, its host in ASCII."""


class SecretKeyRef(CRModel):
    """One key of a Secret in the BatchWebhook's own namespace."""

    name: DNSName
    """Name of the Secret (same namespace as the BatchWebhook)."""
    key: Annotated[str, StringConstraints(max_length=253)] = "secret"
    """Key in the Secret's data whose value is the signing secret, ``whsec_<base64>`` (as OpenAI
    and Standard Webhooks write it)."""


class BatchWebhookSpec(CRModel):
    """Where to send the events of this namespace's batches, which ones, and the signing key."""

    url: WebhookURL
    """Endpoint that receives a POST per event (https, or http; the host in ASCII, an
    internationalised name in its xn-- form; the operator refuses non-public addresses unless its
    configuration allows them)."""
    events: Annotated[list[WebhookEventType], Field(min_length=1, max_length=4)] | None = None
    """Event types to send (batch.completed, batch.failed, batch.expired, batch.cancelled);
    unset: all four."""
    secret_ref: SecretKeyRef
    """Secret holding the signing secret; read at every delivery, so rotating it takes effect at
    the next attempt."""
    disabled: bool = False
    """Hold deliveries (they wait, and are given up like any other after the retry period)."""


class BatchWebhookStatus(CRModel):
    """What the operator delivered to this endpoint, written after every attempt."""

    delivered: int = 0
    """Events delivered (the endpoint answered 2xx)."""
    failed_attempts: int = 0
    """Attempts that failed (non-2xx answer, timeout, refused address, network error)."""
    given_up: int = 0
    """Events given up after the retry period."""
    last_delivered_at: int | None = None
    """Unix seconds of the last successful delivery."""
    last_error: Text | None = None
    """The last failed attempt's error."""
    last_error_at: int | None = None
    """Unix seconds of the last failed attempt."""
    conditions: Conditions | None = None
    """Ready: whether the last attempt (or the configuration check) succeeded."""


__all__ = [
    "BatchWebhookSpec",
    "BatchWebhookStatus",
    "SecretKeyRef",
    "WebhookEventType",
    "WebhookURL",
]
