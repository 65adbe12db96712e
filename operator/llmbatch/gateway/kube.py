"""The gateway's Kubernetes calls, through ``kubernetes_asyncio`` (the project's one client).

:class:`KubeAPI` is the interface the routes use; :class:`GatewayKube` implements it on a real API
server. Objects come back as plain camelCase dicts. Unexpected API errors become a 503 in the
OpenAI envelope (never a 500), conflicts a :class:`Conflict` (``llmbatch.kube``'s).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.api.resources import GROUP, VERSION
from llmbatch.gateway.errors import APIError
from llmbatch.kube import Conflict, KubeClient

log = logging.getLogger(__name__)

__all__ = [
    "Conflict",
    "GatewayKube",
    "KubeAPI",
    "WatchExpired",
    "decode_secret_data",
    "upstream",
]

KEY_LABEL = "llmbatch.io/api-key"
TIMEOUT = 15  # seconds per API call; a hung API server becomes a 503, never a hung request
LIST_PAGE = 500  # objects per page of a cluster-wide listing (one page in memory at a time)
WATCH_SLACK = 30
"""Seconds a watch may outlive its server-side timeout before the client gives up on it: a
connection that went silent (a stalled proxy, a half-open socket) ends instead of hanging."""


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again, then watch from there."""


QUOTA_EXCEEDED = "resource_quota_exceeded"
"""The code of a create a ResourceQuota refused."""


def upstream(exc: ApiException, what: str) -> APIError:
    log.warning("kubernetes %s failed: %s %s", what, exc.status, exc.reason)
    return APIError(
        503,
        "The service is temporarily unable to reach its backing store; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
    )


def quota_exceeded(reason: str) -> APIError:
    """429 for a create the namespace's ResourceQuota refused (``count/batches.llmbatch.io``,
    ``count/batchfiles.llmbatch.io``): it fits again once objects go."""
    return APIError(
        429,
        f"Your organization's resource quota is used up: {reason}",
        type="rate_limit_error",
        code=QUOTA_EXCEEDED,
        headers={"Retry-After": "60"},
    )


class KubeAPI(Protocol):
    """What the gateway needs from Kubernetes."""

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def list_objects(
        self, plural: str, namespace: str, label_selector: str | None = None
    ) -> list[dict[str, Any]]: ...

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def patch(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None: ...

    async def delete(self, plural: str, namespace: str, name: str) -> bool: ...

    async def replace_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any] | None: ...

    async def list_pools(self) -> list[dict[str, Any]]: ...

    async def namespace_annotations(self, namespace: str) -> dict[str, str] | None: ...

    async def namespace_labels(self, namespace: str) -> dict[str, str] | None: ...

    async def list_key_secrets(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_key_secrets(
        self, namespace: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    async def list_namespaces(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_namespaces(
        self, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    def list_cluster_pages(
        self, plural: str
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]: ...

    def watch_cluster(
        self, plural: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    async def close(self) -> None: ...


def decode_secret_data(secret: dict[str, Any]) -> dict[str, str]:
    """``data`` of a Secret (base64) as text; undecodable values are left out."""
    out: dict[str, str] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value).decode("utf-8")
        except (ValueError, TypeError):
            continue
    for key, value in (secret.get("stringData") or {}).items():
        out[key] = str(value)
    return out


@contextlib.contextmanager
def _upstream(what: str) -> Iterator[None]:
    """An API failure the caller cannot act on becomes a 503 in the OpenAI envelope."""
    try:
        yield
    except ApiException as exc:
        raise upstream(exc, what) from exc


class GatewayKube:
    """:class:`KubeAPI` over the project's Kubernetes client (:mod:`llmbatch.kube`)."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> GatewayKube:
        """In-cluster credentials inside a pod (unless a kubeconfig is given), else kubeconfig."""
        return cls(await KubeClient.connect(kubeconfig, request_timeout=TIMEOUT))

    async def close(self) -> None:
        await self.kube.close()

    # --- custom objects (namespaced) -----------------------------------------------------------

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with _upstream(f"get {plural}/{name}"):
            return await self.kube.get_custom(plural, namespace, name)

    async def list_objects(
        self, plural: str, namespace: str, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        with _upstream(f"list {plural}"):
            return await self.kube.list_custom(plural, namespace, label_selector)

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.kube.create_custom(plural, namespace, body)
        except ApiException as exc:
            if exc.status == 404:  # the tenant namespace does not exist
                raise APIError(
                    403,
                    f"The organization of this key ({namespace}) is not provisioned.",
                    type="invalid_request_error",
                    code="organization_not_found",
                ) from exc
            if exc.status == 422:
                raise APIError(
                    400, f"Invalid request: {_reason(exc)}", code="invalid_value"
                ) from exc
            if exc.status == 403 and "exceeded quota" in _reason(exc):
                raise quota_exceeded(_reason(exc)) from exc
            raise upstream(exc, f"create {plural}") from exc

    async def patch(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        with _upstream(f"patch {plural}/{name}"):
            return await self.kube.patch_custom(plural, namespace, name, patch)

    async def delete(self, plural: str, namespace: str, name: str) -> bool:
        with _upstream(f"delete {plural}/{name}"):
            return await self.kube.delete_custom(plural, namespace, name)

    async def replace_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """PUT the status subresource; ``body.metadata.resourceVersion`` is the precondition.

        :class:`Conflict` when the object changed since it was read (re-read and retry), None
        when it is gone.
        """
        with _upstream(f"replace {plural}/{name}/status"):
            return await self.kube.replace_custom_status(plural, namespace, name, body)

    async def list_pools(self) -> list[dict[str, Any]]:
        with _upstream("list batchpools"):
            return await self.kube.list_custom("batchpools")

    # --- list + watch of a kind in every namespace (the listing cache) --------------------------

    async def list_cluster_pages(
        self, plural: str
    ) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        """Every object of a kind, a page at a time, each with the listing's resourceVersion
        (the snapshot every page belongs to: a watch from it misses nothing)."""
        token: str | None = None
        version = ""
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE}
            if token:
                kwargs["_continue"] = token
            page = await self.kube.call_json(
                self.kube.custom.list_cluster_custom_object, GROUP, VERSION, plural, **kwargs
            )
            meta = page.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            yield list(page.get("items") or []), version
            token = meta.get("continue")
            if not token:
                return

    async def watch_cluster(
        self, plural: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """ADDED / MODIFIED / DELETED / BOOKMARK events of a kind in every namespace, until the
        server-side timeout ends the watch; :class:`WatchExpired` on 410 Gone."""
        events = _events(
            self.kube.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            plural,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            # Bookmarks move the resourceVersion on while nothing changes, so the next
            # watch can resume from it instead of meeting 410 and listing everything again.
            allow_watch_bookmarks=True,
            _request_timeout=timeout_seconds + WATCH_SLACK,
        )
        try:
            async for event in events:
                yield event
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(f"{plural} at {resource_version}: {exc.reason}") from exc
            raise

    # --- core ----------------------------------------------------------------------------------

    async def namespace_annotations(self, namespace: str) -> dict[str, str] | None:
        with _upstream(f"read namespace {namespace}"):
            return await self.kube.namespace_annotations(namespace)

    async def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        with _upstream(f"read namespace {namespace}"):
            return await self.kube.namespace_labels(namespace)

    async def list_key_secrets(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        listing = await self.kube.call_json(
            self.kube.core.list_namespaced_secret, namespace, label_selector=f"{KEY_LABEL}=true"
        )
        items: list[dict[str, Any]] = list(listing.get("items") or [])
        return items, str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def watch_key_secrets(
        self, namespace: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """ADDED / MODIFIED / DELETED events until the server-side timeout ends the watch."""
        return _events(
            self.kube.core.list_namespaced_secret,
            namespace,
            label_selector=f"{KEY_LABEL}=true",
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=False,
        )

    async def list_namespaces(self) -> tuple[list[dict[str, Any]], str]:
        return await self.kube.list_namespaces()

    def watch_namespaces(
        self, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """ADDED / MODIFIED / DELETED events of every namespace until the server-side timeout
        ends the watch (a watch that went silent ends :data:`WATCH_SLACK` later)."""
        return _events(
            self.kube.core.list_namespace,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=False,
            _request_timeout=timeout_seconds + WATCH_SLACK,
        )


async def _events(
    list_call: Any, *args: Any, **kwargs: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(type, object)`` of each event of a watch over ``list_call``."""
    watcher = watch.Watch()
    try:
        async with watcher.stream(list_call, *args, **kwargs) as stream:
            async for event in stream:
                raw = event.get("raw_object")
                if isinstance(raw, dict):
                    yield str(event.get("type")), raw
    finally:
        await watcher.close()


def _reason(exc: ApiException) -> str:
    import json

    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason)
    return str(body.get("message") or exc.reason)[:500]
