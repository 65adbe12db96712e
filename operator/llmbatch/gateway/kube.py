"""The gateway's Kubernetes calls, through ``kubernetes_asyncio`` (the project's one client).

:class:`KubeAPI` is the interface the routes use; :class:`GatewayKube` implements it on a real API
server. Objects come back as plain camelCase dicts. Unexpected API errors become a 503 in the
OpenAI envelope (never a 500), conflicts a :class:`Conflict`.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import AsyncIterator
from typing import Any, Protocol

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.api.resources import GROUP, VERSION
from llmbatch.gateway.errors import APIError

log = logging.getLogger(__name__)

KEY_LABEL = "llmbatch.io/api-key"
TIMEOUT = 15  # seconds per API call; a hung API server becomes a 503, never a hung request


class Conflict(Exception):
    """The object exists already (create) or changed underneath (update)."""


def upstream(exc: ApiException, what: str) -> APIError:
    log.warning("kubernetes %s failed: %s %s", what, exc.status, exc.reason)
    return APIError(
        503,
        "The service is temporarily unable to reach its backing store; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
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

    async def list_key_secrets(self, namespace: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch_key_secrets(
        self, namespace: str, resource_version: str, timeout_seconds: int
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


class GatewayKube:
    """:class:`KubeAPI` on a real API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> GatewayKube:
        """In-cluster credentials inside a pod (unless a kubeconfig is given), else kubeconfig."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            return cls(client.ApiClient(configuration=cfg))
        cfg = client.Configuration()
        await config.load_kube_config(
            config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=cfg
        )
        return cls(client.ApiClient(configuration=cfg))

    async def close(self) -> None:
        await self.api.close()

    async def _call(self, fn: Any, *args: Any, retry_5xx: bool = True, **kwargs: Any) -> Any:
        """One API call; a throttled (429) or briefly failing (5xx) API server is retried twice.

        Creates pass ``retry_5xx=False``: a 5xx may come after the object was made.
        """
        for attempt in range(3):
            try:
                return await fn(*args, **kwargs)
            except ApiException as exc:
                status = exc.status or 0
                if attempt == 2 or not (status == 429 or (retry_5xx and 500 <= status < 600)):
                    raise
                await asyncio.sleep(0.1 * (attempt + 1) ** 2)
        raise AssertionError("unreachable")

    def _plain(self, obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return result

    # --- custom objects (namespaced) -----------------------------------------------------------

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._call(
                self.custom.get_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise upstream(exc, f"get {plural}/{name}") from exc
        return obj

    async def list_objects(
        self, plural: str, namespace: str, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {}
        if label_selector:
            kwargs["label_selector"] = label_selector
        try:
            listing = await self._call(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                _request_timeout=TIMEOUT,
                **kwargs,
            )
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise upstream(exc, f"list {plural}") from exc
        items: list[dict[str, Any]] = listing.get("items", [])
        return items

    async def create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            created: dict[str, Any] = await self._call(
                self.custom.create_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                body,
                retry_5xx=False,
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(body["metadata"]["name"]) from exc
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
            raise upstream(exc, f"create {plural}") from exc
        return created

    async def patch(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._call(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                _request_timeout=TIMEOUT,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise upstream(exc, f"patch {plural}/{name}") from exc
        return obj

    async def delete(self, plural: str, namespace: str, name: str) -> bool:
        try:
            await self._call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise upstream(exc, f"delete {plural}/{name}") from exc
        return True

    async def replace_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """PUT the status subresource; ``body.metadata.resourceVersion`` is the precondition.

        :class:`Conflict` when the object changed since it was read (re-read and retry), None
        when it is gone.
        """
        try:
            obj: dict[str, Any] = await self._call(
                self.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
                retry_5xx=False,
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            if exc.status == 404:
                return None
            raise upstream(exc, f"replace {plural}/{name}/status") from exc
        return obj

    async def list_pools(self) -> list[dict[str, Any]]:
        try:
            listing = await self._call(
                self.custom.list_cluster_custom_object,
                GROUP,
                VERSION,
                "batchpools",
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise upstream(exc, "list batchpools") from exc
        items: list[dict[str, Any]] = listing.get("items", [])
        return items

    # --- core ----------------------------------------------------------------------------------

    async def namespace_annotations(self, namespace: str) -> dict[str, str] | None:
        try:
            ns = await self._call(self.core.read_namespace, namespace, _request_timeout=TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise upstream(exc, f"read namespace {namespace}") from exc
        return dict(ns.metadata.annotations or {})

    async def list_key_secrets(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        listing = await self._call(
            self.core.list_namespaced_secret,
            namespace,
            label_selector=f"{KEY_LABEL}=true",
            _request_timeout=TIMEOUT,
        )
        items = [self._plain(item) for item in listing.items]
        return items, str(listing.metadata.resource_version or "")

    async def watch_key_secrets(
        self, namespace: str, resource_version: str, timeout_seconds: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """ADDED / MODIFIED / DELETED events until the server-side timeout ends the watch."""
        watcher = watch.Watch()
        try:
            async with watcher.stream(
                self.core.list_namespaced_secret,
                namespace,
                label_selector=f"{KEY_LABEL}=true",
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                allow_watch_bookmarks=False,
            ) as stream:
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
