"""The configuration check of a BatchWebhook: its ``Ready`` condition before any delivery.

Run when the operator sees a generation of the object it has not checked: the URL (scheme, an
ASCII host, an address the guard allows) and the signing Secret (readable by the operator,
labelled for signing, a usable key). A delivery attempt sets ``Ready`` again from its own
outcome, and checks the addresses again where it connects: what this check resolved is advice,
never what a delivery trusts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from yarl import URL

from llmbatch.api.resources import BatchWebhookSpec
from llmbatch.controller.webhooks.kubeio import WebhookIO
from llmbatch.core import webhooks as rules
from llmbatch.core.netguard import IPNetwork, url_problem
from llmbatch.outbound.guard import GuardedResolver, Refused, check_host, literal


def checked(body: Mapping[str, Any]) -> bool:
    """Whether the object's ``Ready`` condition is for its current generation."""
    generation = (body.get("metadata") or {}).get("generation")
    for condition in (body.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("observedGeneration") == generation)
    return False


async def problem(
    io: WebhookIO,
    namespace: str,
    spec: BatchWebhookSpec,
    allowed: Sequence[IPNetwork],
    timeout: float,
) -> str | None:
    """What keeps deliveries to this endpoint from working, or None."""
    why = url_problem(spec.url)
    if why:
        return why
    try:
        url = URL(spec.url)
    except ValueError as exc:
        return f"bad URL: {exc}"
    host = url.raw_host or ""  # the host exactly as the sender's aiohttp sees it
    try:
        check_host(host, allowed)
        if literal(host) is None:
            await asyncio.wait_for(GuardedResolver(allowed).resolve(host, url.port or 0), timeout)
        rules.signing_key(await io.secret_value(namespace, spec.secret_ref))
    except Refused as exc:
        return f"refused: {exc}"
    except TimeoutError:
        return f"{host} did not resolve within {timeout:g}s"
    except OSError as exc:
        return f"{host} does not resolve: {exc}"
    except ValueError as exc:
        return str(exc)
    return None


async def check(
    io: WebhookIO, body: Mapping[str, Any], allowed: Sequence[IPNetwork], timeout: float
) -> None:
    """Check one BatchWebhook and write its ``Ready`` condition."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    try:
        spec = BatchWebhookSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        await io.set_ready(namespace, name, uid, False, "InvalidSpec", str(exc)[:1024])
        return
    why = await problem(io, namespace, spec, allowed, timeout)
    if why:
        await io.set_ready(namespace, name, uid, False, "ConfigError", why)
    else:
        message = "The URL's host is allowed and the signing Secret is labelled and readable."
        await io.set_ready(namespace, name, uid, True, "Configured", message)
