"""Gateway settings, read from the environment (documented in docs/gateway.md)."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from llmbatch.core.quotas import DEFAULT_MAX_STORED_BYTES, DEFAULT_MAX_WAITING_BATCHES, TenantCaps

DEFAULT_MAX_UPLOAD_BYTES = 256 * 1024 * 1024  # seed 000: inputs are limited to 256 MiB
DEFAULT_METRICS_PORT = 9090
DEFAULT_RATE_LIMIT = 100
"""Requests per second an API key may send after its burst."""
DEFAULT_RATE_BURST = 200
"""Requests an API key may send at once."""
_SA_NAMESPACE = pathlib.Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _own_namespace() -> str:
    try:
        return _SA_NAMESPACE.read_text().strip() or "llmbatch-system"
    except OSError:
        return "llmbatch-system"


def _int(
    env: dict[str, str], name: str, default: int, minimum: int = 1, maximum: int | None = None
) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def _bool(env: dict[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("true", "1", "yes", "on"):
        return True
    if raw in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


def _float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be a number, got {raw!r}") from exc
    if not 0 <= value <= 60:
        raise ValueError(f"{name} must be between 0 and 60, got {value}")
    return value


@dataclass(frozen=True)
class GatewaySettings:
    """Everything the gateway process is configured with."""

    store_uri: str
    """``LLMBATCH_STORE_URI``: the object store (see docs/storage.md)."""
    gateway_namespace: str = "llmbatch-system"
    """``LLMBATCH_GATEWAY_NAMESPACE``: where the API-key Secrets live."""
    kubeconfig: str | None = None
    """``KUBECONFIG``: kubeconfig path; in-cluster credentials when unset inside a pod."""
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    """``LLMBATCH_GATEWAY_MAX_UPLOAD_BYTES``: largest accepted file upload (413 above)."""
    key_resync_seconds: int = 30
    """``LLMBATCH_GATEWAY_KEY_RESYNC_SECONDS``: full re-list period of the key Secrets."""
    read_cache_seconds: float = 1.0
    """``LLMBATCH_GATEWAY_READ_CACHE_SECONDS``: serve batch/file reads this recent (0: off)."""
    list_resync_seconds: int = 600
    """``LLMBATCH_GATEWAY_LIST_RESYNC_SECONDS``: full re-list period of the listing caches of
    batches and files (between re-lists a watch keeps them current)."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """``LLMBATCH_GATEWAY_METRICS_PORT``: Prometheus ``/metrics`` listener (0: none); never
    served on the API port."""
    metrics_host: str = "0.0.0.0"
    """``LLMBATCH_GATEWAY_METRICS_HOST``: address of the metrics listener (``llmbatch gateway``
    sets it to ``--host`` unless given)."""
    docs: bool = False
    """``LLMBATCH_GATEWAY_DOCS``: serve ``/docs``, ``/redoc`` and ``/openapi.json``."""
    remote_media: bool = False
    """``LLMBATCH_REMOTE_MEDIA``: rows may give images and audio as http(s) URLs, fetched by the
    engine (the chart's ``remoteMedia.enabled`` opens the executors' egress); off: data: URLs
    only, a remote one is refused with the line's number."""
    rate_limit: int = DEFAULT_RATE_LIMIT
    """``LLMBATCH_GATEWAY_RATE_LIMIT``: requests per second one API key may send, after its
    burst (0: no limit); past it 429 ``rate_limit_exceeded`` with ``Retry-After``."""
    rate_burst: int = DEFAULT_RATE_BURST
    """``LLMBATCH_GATEWAY_RATE_BURST``: requests one API key may send at once."""
    max_waiting_batches: int = DEFAULT_MAX_WAITING_BATCHES
    """``LLMBATCH_MAX_WAITING_BATCHES``: a tenant's unfinished batches at most, unless its
    namespace's ``llmbatch.io/max-waiting-batches`` says otherwise (0: no default cap); past it
    429 ``too_many_batches``."""
    max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES
    """``LLMBATCH_MAX_STORED_BYTES``: the bytes a tenant's files may hold, unless its
    namespace's ``llmbatch.io/max-stored-bytes`` says otherwise (0: no default cap); an upload
    past it is refused with 400 ``storage_quota_exceeded``."""

    @property
    def tenant_caps(self) -> TenantCaps:
        """The caps of a tenant whose namespace sets none."""
        return TenantCaps.defaults(self.max_waiting_batches, self.max_stored_bytes)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GatewaySettings:
        values = dict(os.environ if env is None else env)
        store_uri = values.get("LLMBATCH_STORE_URI", "")
        if not store_uri:
            raise ValueError("LLMBATCH_STORE_URI is not set (e.g. file:///var/lib/llmbatch)")
        return cls(
            store_uri=store_uri,
            gateway_namespace=values.get("LLMBATCH_GATEWAY_NAMESPACE") or _own_namespace(),
            kubeconfig=values.get("KUBECONFIG") or None,
            max_upload_bytes=_int(
                values, "LLMBATCH_GATEWAY_MAX_UPLOAD_BYTES", DEFAULT_MAX_UPLOAD_BYTES
            ),
            key_resync_seconds=_int(values, "LLMBATCH_GATEWAY_KEY_RESYNC_SECONDS", 30),
            read_cache_seconds=_float(values, "LLMBATCH_GATEWAY_READ_CACHE_SECONDS", 1.0),
            list_resync_seconds=_int(values, "LLMBATCH_GATEWAY_LIST_RESYNC_SECONDS", 600, 10),
            metrics_port=_int(
                values,
                "LLMBATCH_GATEWAY_METRICS_PORT",
                DEFAULT_METRICS_PORT,
                minimum=0,
                maximum=65535,
            ),
            metrics_host=values.get("LLMBATCH_GATEWAY_METRICS_HOST") or "0.0.0.0",
            docs=_bool(values, "LLMBATCH_GATEWAY_DOCS", False),
            remote_media=_bool(values, "LLMBATCH_REMOTE_MEDIA", False),
            rate_limit=_int(values, "LLMBATCH_GATEWAY_RATE_LIMIT", DEFAULT_RATE_LIMIT, 0),
            rate_burst=_int(values, "LLMBATCH_GATEWAY_RATE_BURST", DEFAULT_RATE_BURST),
            max_waiting_batches=_int(
                values, "LLMBATCH_MAX_WAITING_BATCHES", DEFAULT_MAX_WAITING_BATCHES, 0
            ),
            max_stored_bytes=_int(values, "LLMBATCH_MAX_STORED_BYTES", DEFAULT_MAX_STORED_BYTES, 0),
        )
