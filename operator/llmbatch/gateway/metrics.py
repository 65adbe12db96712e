"""Prometheus metrics of the gateway: its own registry, served by a listener of its own.

The listener (``LLMBATCH_GATEWAY_METRICS_PORT``, default 9090) is a small HTTP server on a
thread, never the API port: scrapes do not pass the API's authentication, middleware or event
loop, and ``/metrics`` is not reachable wherever the API is exposed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmbatch.buildinfo import build_labels
from llmbatch.storage import ObjectStore
from llmbatch.storage.instrumented import InstrumentedStore

REGISTRY = CollectorRegistry(auto_describe=True)

BUILD_INFO = Gauge(
    "llmbatch_gateway_build_info",
    "Always 1: the gateway's package version and the source revision it was built from.",
    ["version", "revision"],
    registry=REGISTRY,
)
REQUESTS = Counter(
    "llmbatch_gateway_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "code"],
    registry=REGISTRY,
)
LATENCY = Histogram(
    "llmbatch_gateway_request_seconds",
    "Time to the response headers, by route template and method.",
    ["route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
    registry=REGISTRY,
)
UPLOAD_BYTES = Counter(
    "llmbatch_gateway_upload_bytes_total",
    "Bytes of accepted file uploads.",
    registry=REGISTRY,
)
UPLOADS_REJECTED = Counter(
    "llmbatch_gateway_uploads_rejected_total",
    "Uploads refused, by error code.",
    ["code"],
    registry=REGISTRY,
)
BATCHES_CREATED = Counter(
    "llmbatch_gateway_batches_created_total",
    "Batches created through the API (idempotent replays not counted).",
    registry=REGISTRY,
)
BATCHES_REFUSED = Counter(
    "llmbatch_gateway_batches_refused_total",
    "Batch creations refused by admission: size caps, queue quotas, credit (by error code).",
    ["code"],
    registry=REGISTRY,
)
CREDITS_RESERVED = Counter(
    "llmbatch_gateway_credits_reserved_total",
    "Credit reserved for new batches, in currency units (tenants are not a label: unbounded).",
    registry=REGISTRY,
)
AUTH_FAILURES = Counter(
    "llmbatch_gateway_auth_failures_total",
    "Requests refused for a missing, unknown or insufficient key, or a key whose tenant "
    "namespace is gone (deleted, or another namespace of the same name), by reason.",
    ["reason"],
    registry=REGISTRY,
)
TASK_RESTARTS = Counter(
    "llmbatch_gateway_background_task_restarts_total",
    "Background tasks of the gateway (the key, namespace and listing watches, the archive "
    "loader) run again after they failed, by task.",
    ["task"],
    registry=REGISTRY,
)
ARCHIVE_UNREADABLE = Counter(
    "llmbatch_gateway_archive_unreadable_records_total",
    "Archived batch records the listing's archive loader could not read (a store error: read "
    "again later; or not a record: left out), skipped while the rest load.",
    registry=REGISTRY,
)
RATE_LIMITED = Counter(
    "llmbatch_gateway_rate_limited_total",
    "Requests refused with 429 rate_limit_exceeded: their API key was over its request rate.",
    registry=REGISTRY,
)
API_KEYS = Gauge("llmbatch_gateway_api_keys", "API keys currently loaded.", registry=REGISTRY)
STORE_SECONDS = Histogram(
    "llmbatch_gateway_store_operation_seconds",
    "Time of the gateway's object-store calls, by operation.",
    ["op"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
STORE_ERRORS = Counter(
    "llmbatch_gateway_store_errors_total",
    "The gateway's object-store calls that failed (a missing key is not a failure), by operation.",
    ["op"],
    registry=REGISTRY,
)


def instrument_store(store: ObjectStore) -> ObjectStore:
    """``store`` with its calls timed and failures counted (``llmbatch_gateway_store_*``)."""
    if isinstance(store, InstrumentedStore):
        return store
    return InstrumentedStore(store, STORE_SECONDS, STORE_ERRORS)


@contextlib.contextmanager
def serving(port: int, host: str) -> Iterator[int | None]:
    """Record the build and serve the registry on ``host:port`` while the block runs (port 0:
    serve none).

    Yields the bound port. A port already taken raises (OSError): the gateway does not start
    without the metrics it was told to serve.
    """
    BUILD_INFO.labels(**build_labels()).set(1)
    if not port:
        yield None
        return
    server, thread = start_http_server(port, addr=host, registry=REGISTRY)
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def count_keys(keys: Any) -> None:
    """``llmbatch_gateway_api_keys`` reads ``len(keys)`` at every scrape."""
    API_KEYS.set_function(lambda: len(keys))


class MetricsMiddleware:
    """Counts every HTTP response by its route template (never the raw path: bounded labels)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                route = scope.get("route")
                template = getattr(route, "path", None) or "unmatched"
                LATENCY.labels(template, _method(scope)).observe(time.perf_counter() - started)
                status["route"] = template
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            REQUESTS.labels(
                status.get("route", "unmatched"), _method(scope), str(status["code"])
            ).inc()


_METHODS = frozenset({"GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"})


def _method(scope: Scope) -> str:
    method = str(scope.get("method", ""))
    return method if method in _METHODS else "OTHER"
