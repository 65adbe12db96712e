"""Signed webhooks for batch ends (docs/webhooks.md): the dispatcher, its sender and guard.

The pure rules — event body, ids, signature, retry schedule, address rules — are in
:mod:`llmbatch.core.webhooks` and :mod:`llmbatch.core.netguard`.
"""

from __future__ import annotations

from llmbatch.controller.webhooks.dispatcher import WebhookDispatcher, deliveries_of
from llmbatch.controller.webhooks.sender import Attempt, Sender
from llmbatch.outbound.guard import (
    GuardedResolver,
    GuardedSockets,
    Refused,
    check_host,
    refusals,
)

__all__ = [
    "Attempt",
    "GuardedResolver",
    "GuardedSockets",
    "Refused",
    "Sender",
    "WebhookDispatcher",
    "check_host",
    "deliveries_of",
    "refusals",
]
