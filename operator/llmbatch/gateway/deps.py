"""Request dependencies: the gateway's state, and the caller's API key with its scopes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from llmbatch import logs
from llmbatch.core.ratelimit import KeyRateLimiter, retry_after_header
from llmbatch.gateway import metrics
from llmbatch.gateway.archive import BatchArchive
from llmbatch.gateway.auth import KeyRing, Principal, admit
from llmbatch.gateway.errors import APIError, rate_limited, unauthorized
from llmbatch.gateway.kube import KubeAPI
from llmbatch.gateway.listcache import Listings
from llmbatch.gateway.namespaces import Namespaces
from llmbatch.gateway.readcache import ReadCache
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.storage import ObjectStore


@dataclass
class Gateway:
    """Everything a request handler needs (``app.state.gateway``, set by the lifespan)."""

    settings: GatewaySettings
    kube: KubeAPI
    store: ObjectStore
    keyring: KeyRing
    reads: ReadCache
    lists: Listings
    archive: BatchArchive
    """Finished batches that left the API server (retention): answered from the store."""
    namespaces: Namespaces
    """The tenant namespaces as they are now (a key acts only for its own, ``core.identity``)."""
    limiter: KeyRateLimiter = field(default_factory=lambda: KeyRateLimiter(0, 1))
    """The request rate of each API key (off unless the settings give a rate)."""


def state_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def gateway_of(request: Request) -> Gateway:
    """The dependency (async: a sync dependency would cost a thread-pool hop per request)."""
    return state_of(request)


_bearer = HTTPBearer(
    auto_error=False, description="An API key: `Authorization: Bearer sk-llmb-...`"
)


async def authenticate(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The key's principal; 401 for a missing, unknown or revoked key, and for a key whose
    namespace is gone (``core.identity``)."""
    if credentials is None or not credentials.credentials:
        metrics.AUTH_FAILURES.labels("missing").inc()
        raise unauthorized(
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    gw = state_of(request)
    principal = gw.keyring.authenticate(credentials.credentials)
    reason = "invalid"
    if principal is not None:
        tenant = gw.namespaces.identity(principal.namespace)
        principal = admit(await gw.keyring.bound(principal, tenant, gw.store), tenant)
        reason = "tenant_gone"  # its namespace was deleted, or is another of the same name
    if principal is None:
        metrics.AUTH_FAILURES.labels(reason).inc()
        shown = credentials.credentials[:8] + "****" if len(credentials.credentials) > 12 else ""
        raise unauthorized(f"Incorrect API key provided: {shown or '****'}.")
    logs.bind_context(tenant=principal.namespace)
    limiter = state_of(request).limiter
    wait = limiter.admit(principal.key_name)
    if wait is not None:
        metrics.RATE_LIMITED.inc()
        raise rate_limited(retry_after_header(wait), limiter.rate, limiter.burst)
    return principal


async def reader(who: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """A key that may read (403 otherwise)."""
    if not who.can_read():
        metrics.AUTH_FAILURES.labels("scope").inc()
        raise _missing_scope("inference:read")
    return who


async def writer(who: Annotated[Principal, Depends(authenticate)]) -> Principal:
    """A key that may write (403 otherwise)."""
    if not who.can_write():
        metrics.AUTH_FAILURES.labels("scope").inc()
        raise _missing_scope("inference:write")
    return who


def _missing_scope(scope: str) -> APIError:
    return APIError(
        403,
        f"You have insufficient permissions for this operation. Missing scopes: {scope}.",
        type="permission_error",
        code="insufficient_scope",
    )


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
GW = Annotated[Gateway, Depends(gateway_of)]
