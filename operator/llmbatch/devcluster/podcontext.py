"""What a pod runner needs from the node agent: its directories, environment and API calls."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSON = dict[str, Any]

# (kind "Secret" | "ConfigMap", namespace, name) -> the object's data, None when absent.
ObjectReader = Callable[[str, str, str], Awaitable[dict[str, str] | None]]
# (namespace, pod, {"status": …}) -> False once the pod is gone.
StatusWriter = Callable[[str, str, JSON], Awaitable[bool]]
# (pod, service account, expirationSeconds, audience or None) -> token
TokenRequester = Callable[[JSON, str, int, str | None], Awaitable[str]]


class ContainerConfigError(Exception):
    """The container cannot start yet (missing secret or config map, no command, no token)."""


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodContext:
    """What a pod runner needs from the node agent."""

    pods_dir: Path
    node_allocatable: Mapping[str, str]
    base_env: Mapping[str, str]
    marker: str
    read_object: ObjectReader
    write_status: StatusWriter
    delete_pod: Callable[[str, str, str], Awaitable[None]]
    record_event: Callable[[JSON, str, str, str], Awaitable[None]]
    request_token: TokenRequester | None = None
    """Mints a service-account token for a pod (None: no projected token volumes)."""
    server: str = ""
    """API server URL written into a pod's service-account kubeconfig."""
    ca_data: bytes = b""
    """API server CA (PEM) written next to the token."""
    restart_backoff_max: float = 10.0
