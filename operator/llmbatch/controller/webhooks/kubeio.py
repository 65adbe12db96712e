"""What webhook deliveries read and write through the operator's Kubernetes client.

Reads: the namespace's BatchWebhooks, one key of a Secret labelled for signing. Writes: the
Batch's deliveries annotation (the durable state), its ``WebhooksDelivered`` condition and Events
(what ``kubectl describe batch`` shows), and the BatchWebhook's status counters and ``Ready``
condition.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.api.resources import API_VERSION, BatchConditionType, SecretKeyRef
from llmbatch.controller.kube import Kube
from llmbatch.core import lifecycle
from llmbatch.core.webhooks import (
    DELIVERIES_ANNOTATION,
    Deliveries,
    Delivery,
    unlabelled,
)
from llmbatch.kube import Conflict
from llmbatch.kube.status import update_status

log = logging.getLogger(__name__)

CONDITION = BatchConditionType.WEBHOOKS_DELIVERED
"""The Batch condition that sums up its deliveries."""
COMPONENT = "llmbatch-operator"


class WebhookIO:
    """The Kubernetes side of deliveries, over the operator's :class:`Kube`."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def batch(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Batch as it is now (None: deleted)."""
        return await self.kube.get_custom("batches", namespace, name)

    async def webhooks(self, namespace: str) -> list[dict[str, Any]]:
        """Every BatchWebhook of the namespace."""
        return await self.kube.list_custom("batchwebhooks", namespace)

    async def webhook(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One BatchWebhook (None: deleted)."""
        return await self.kube.get_custom("batchwebhooks", namespace, name)

    async def secret_value(self, namespace: str, ref: SecretKeyRef) -> str:
        """The signing secret, from a Secret labelled for signing (:data:`SIGNING_LABEL`);
        ValueError saying what is missing."""
        where = f"Secret {namespace}/{ref.name}"
        try:
            secret = await self.kube.read_secret(namespace, ref.name)
        except ApiException as exc:
            if exc.status == 403:
                raise ValueError(f"{where} is not readable by the operator") from exc
            raise
        if secret is None:
            raise ValueError(f"{where} does not exist")
        why = unlabelled(namespace, ref.name, (secret.get("metadata") or {}).get("labels"))
        if why:  # before its data is looked at: an unlabelled Secret is never a key
            raise ValueError(why)
        raw = (secret.get("data") or {}).get(ref.key)
        if not raw:
            raise ValueError(f"{where} has no key {ref.key!r}")
        try:
            return base64.b64decode(raw).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise ValueError(f"{where} key {ref.key!r} is not text") from exc

    async def save(
        self, batch: dict[str, Any], deliveries: Deliveries, summary: tuple[bool, str, str]
    ) -> None:
        """Write the deliveries annotation, then the ``WebhooksDelivered`` condition."""
        meta = batch["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        patch = {"metadata": {"annotations": {DELIVERIES_ANNOTATION: deliveries.to_annotation()}}}
        if await self.kube.patch_custom("batches", namespace, name, patch) is None:
            return
        status, reason, message = summary

        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            current = dict(obj.get("status") or {})
            conditions = current.get("conditions") or []
            wanted = lifecycle.set_condition(
                conditions, CONDITION, status, reason, message, time.time()
            )
            if wanted == conditions:
                return None
            return {**current, "conditions": wanted}

        async def write(obj: dict[str, Any]) -> bool:
            version = obj["metadata"]["resourceVersion"]
            body = {
                "metadata": {"resourceVersion": version},
                "status": {"conditions": obj["status"]["conditions"]},
            }
            try:
                return await self.kube.patch_custom_status("batches", namespace, name, body)
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(name) from exc
                raise

        await update_status(lambda: self.batch(namespace, name), write, change)

    async def event(self, batch: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        """An Event on the Batch (failures are logged: an Event is never worth a retry)."""
        meta = batch["metadata"]
        involved = {
            "apiVersion": API_VERSION,
            "kind": "Batch",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        }
        posted = await self.kube.post_event(
            involved, reason, message, warning=warning, component=COMPONENT
        )
        if not posted:
            log.warning("event %s on %s/%s not posted", reason, meta["namespace"], meta["name"])

    async def record_attempt(
        self, namespace: str, name: str, delivery: Delivery, outcome: str, error: str | None
    ) -> None:
        """Count the attempt on the BatchWebhook's status and set its ``Ready`` condition
        (``ConfigError`` when the attempt never started: URL or signing Secret unusable)."""
        ok = outcome == "delivered"
        now = int(time.time())

        def count(status: dict[str, Any]) -> None:
            if ok:
                status["delivered"] = int(status.get("delivered") or 0) + 1
                status["lastDeliveredAt"] = now
            else:
                status["failedAttempts"] = int(status.get("failedAttempts") or 0) + 1
                status["lastError"] = (error or "")[:4096]
                status["lastErrorAt"] = now
            if delivery.state == "GivenUp":
                status["givenUp"] = int(status.get("givenUp") or 0) + 1

        ready = (True, "Delivered", "The last delivery succeeded.")
        if outcome == "config_error":
            ready = (False, "ConfigError", error or "")
        elif not ok:
            ready = (False, "DeliveryFailed", f"The last attempt failed: {error}")
        await self._update_webhook(namespace, name, delivery.webhook_uid, count, ready)

    async def set_ready(
        self, namespace: str, name: str, uid: str, ok: bool, reason: str, message: str
    ) -> None:
        """Set the BatchWebhook's ``Ready`` condition (for the generation read)."""
        await self._update_webhook(namespace, name, uid, None, (ok, reason, message))

    async def _update_webhook(
        self,
        namespace: str,
        name: str,
        uid: str,
        count: Callable[[dict[str, Any]], None] | None,
        ready: tuple[bool, str, str],
    ) -> None:
        def change(obj: dict[str, Any]) -> dict[str, Any] | None:
            if obj["metadata"].get("uid") != uid:
                return None  # another BatchWebhook of that name now
            status = dict(obj.get("status") or {})
            if count is not None:
                count(status)
            conditions = lifecycle.set_condition(
                status.get("conditions"), "Ready", *ready, time.time()
            )
            for condition in conditions:
                if condition["type"] == "Ready":
                    condition["observedGeneration"] = obj["metadata"].get("generation")
            if count is None and conditions == status.get("conditions"):
                return None
            status["conditions"] = conditions
            return status

        async def write(obj: dict[str, Any]) -> Any:
            return await self.kube.replace_custom_status("batchwebhooks", namespace, name, obj)

        await update_status(lambda: self.webhook(namespace, name), write, change)
