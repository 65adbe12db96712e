"""The gateway's FastAPI app: OpenAI Files / Batches / Models onto BatchFile / Batch / BatchPool.

Stateless: every fact lives in Kubernetes objects (tenant namespace = the key's ``namespace``) or
in the object store. ``create_app()`` builds the app; ``llmbatch gateway`` serves it with uvicorn.
Routes (``llmbatch.gateway.routes``) are served under both ``/v1`` and ``/openai/v1``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response

from llmbatch.background import stop, supervise
from llmbatch.core.ratelimit import KeyRateLimiter
from llmbatch.gateway import metrics
from llmbatch.gateway.archive import BatchArchive
from llmbatch.gateway.auth import KeyRing
from llmbatch.gateway.deps import Gateway, state_of
from llmbatch.gateway.errors import install_handlers
from llmbatch.gateway.kube import GatewayKube, KubeAPI
from llmbatch.gateway.listcache import Listings
from llmbatch.gateway.namespaces import Namespaces
from llmbatch.gateway.readcache import ReadCache
from llmbatch.gateway.reflector import Reflector
from llmbatch.gateway.routes import ROUTERS
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.storage import ObjectStore, open_store

FIRST_SYNC_WAIT_SECONDS = 10.0
"""How long the start waits for the keys, the namespaces and the listing caches before serving
anyway."""


def create_app(
    settings: GatewaySettings | None = None,
    *,
    kube: KubeAPI | None = None,
    store: ObjectStore | None = None,
) -> FastAPI:
    """The gateway app; settings from the environment unless given (see docs/gateway.md).

    ``/docs``, ``/redoc`` and ``/openapi.json`` only with ``settings.docs``; ``/metrics`` is
    never served here but by a listener of its own (``settings.metrics_port``).
    """
    cfg = settings or GatewaySettings.from_env()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with metrics.serving(cfg.metrics_port, cfg.metrics_host):
            async with _serving(app, cfg, kube, store):
                yield

    app = FastAPI(
        title="llm-batch-operator gateway",
        version="0.1.0",
        description="OpenAI-compatible Files, Batches and Models API (served under /v1 and "
        "/openai/v1).",
        lifespan=lifespan,
        redirect_slashes=False,
        docs_url="/docs" if cfg.docs else None,
        redoc_url="/redoc" if cfg.docs else None,
        openapi_url="/openapi.json" if cfg.docs else None,
    )
    install_handlers(app)
    for router in ROUTERS:
        app.include_router(router, prefix="/v1")
        app.include_router(router, prefix="/openai/v1", include_in_schema=False)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz(request: Request) -> Response:
        gw = state_of(request)
        if not gw.keyring.loaded:
            return Response(b'{"status":"keys not loaded"}', 503, media_type="application/json")
        if not gw.namespaces.synced.is_set():
            body = b'{"status":"namespaces not loaded"}'
            return Response(body, 503, media_type="application/json")
        if not gw.lists.synced:
            return Response(b'{"status":"lists not synced"}', 503, media_type="application/json")
        return Response(b'{"status":"ok"}', media_type="application/json")

    app.add_middleware(metrics.MetricsMiddleware)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


@contextlib.asynccontextmanager
async def _serving(
    app: FastAPI, cfg: GatewaySettings, kube: KubeAPI | None, store: ObjectStore | None
) -> AsyncIterator[None]:
    """The gateway's state for the app's lifetime: API client, store, key ring and the
    namespaces with their watches, the listing caches and theirs, the archive's loader — each
    watch a supervised task (``llmbatch.background``)."""
    kube_api: KubeAPI = kube or await GatewayKube.connect(cfg.kubeconfig)
    ring = KeyRing()
    metrics.count_keys(ring)
    objects = metrics.instrument_store(store or open_store(cfg.store_uri))
    namespaces = Namespaces()
    archive = BatchArchive(objects, namespaces.identity)
    lists = Listings.of(kube_api, cfg.list_resync_seconds, archive, namespaces.synced.wait)
    reads = ReadCache(kube_api, cfg.read_cache_seconds)
    namespaces.on_gone(lists.forget)
    namespaces.on_gone(reads.forget)
    app.state.gateway = Gateway(
        cfg,
        kube_api,
        objects,
        ring,
        reads,
        lists,
        archive,
        namespaces,
        KeyRateLimiter(cfg.rate_limit, cfg.rate_burst),
    )
    keys = Reflector(
        ring,
        functools.partial(kube_api.list_key_secrets, cfg.gateway_namespace),
        functools.partial(kube_api.watch_key_secrets, cfg.gateway_namespace),
        cfg.key_resync_seconds,
    )
    tenants = Reflector(
        namespaces, kube_api.list_namespaces, kube_api.watch_namespaces, cfg.list_resync_seconds
    )
    watches = [
        supervise("key-watch", keys.run, metrics.TASK_RESTARTS),
        supervise("namespace-watch", tenants.run, metrics.TASK_RESTARTS),
    ]
    lists.start()
    # Until the lists are synced the list routes ask the API server, as before the caches, and
    # /readyz says not ready: a slow first listing holds up the start for a while, not forever.
    # The archive's records are not waited for (``gateway.archiveloader``).
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(
            asyncio.gather(keys.first_sync.wait(), tenants.first_sync.wait(), lists.wait_synced()),
            timeout=FIRST_SYNC_WAIT_SECONDS,
        )
    # The imported modules (the Kubernetes client's models above all) are ~100k long-lived
    # objects; moving them out of the collector's view keeps full collections from pausing
    # requests for tens of milliseconds.
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        await lists.stop()
        await stop(*watches)
        if kube is None:
            await kube_api.close()


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document; FastAPI documents 422 for validation errors, the gateway answers
    those with 400."""
    if app.openapi_schema is None:
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                if isinstance(operation, dict):
                    operation.get("responses", {}).pop("422", None)
        app.openapi_schema = schema
    return app.openapi_schema
