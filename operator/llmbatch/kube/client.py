"""The project's one Kubernetes client: every API call the operator and the gateway make.

Built on ``kubernetes_asyncio`` (the event loops of kopf and of the gateway must never block on a
synchronous client). Objects come back as plain camelCase dicts. Reads and merge patches that
meet a throttled (429) or briefly failing (5xx) API server are retried; creates and conditional
writes are not retried on 5xx (the object may have been written), save a create the server
answered 503 (not served; the name keeps a retry from making two). A 409 on a create or on a
resourceVersion-guarded write is :class:`Conflict`; a 404 reads as "not there" (None / False).
Every other failure is the ``ApiException`` itself, for the caller's boundary to map (the gateway
answers 503, the operator's next reconcile retries).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit
from urllib.request import getproxies, proxy_bypass

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.api.resources import GROUP, VERSION

_T = TypeVar("_T")
log = logging.getLogger(__name__)
_MERGE_PATCH = "application/merge-patch+json"
#: The HTTP read buffer, as kubernetes_asyncio sizes it: a watch event carries a whole object
#: (etcd allows 1.5 MiB).
READ_BUFSIZE = 2**21


UNAVAILABLE_SECONDS = 10.0
"""How long a create the API server answered 503 (unavailable) is tried again, with pauses
from 0.2 s doubling to 2 s."""


class Conflict(Exception):
    """The object exists already (create) or changed since it was read (conditional write)."""


class KubeClient:
    """Typed verbs over the API calls the project makes (custom objects, namespaces, Jobs, Pods,
    Secrets); ``request_timeout`` bounds every call (None: the client's default)."""

    def __init__(self, api: client.ApiClient, request_timeout: float | None = None) -> None:
        self.api = api
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.request_timeout = request_timeout

    @classmethod
    async def connect(
        cls, kubeconfig: str | None = None, request_timeout: float | None = None
    ) -> Self:
        """In-cluster credentials inside a pod (unless a kubeconfig is given), else kubeconfig."""
        cfg = client.Configuration()
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        else:
            await config.load_kube_config(
                config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=cfg
            )
        api = client.ApiClient(configuration=cfg)
        _read_environment_once(api, cfg)
        return cls(api, request_timeout)

    async def close(self) -> None:
        await self.api.close()

    async def call(
        self, fn: Callable[..., Awaitable[_T]], *args: Any, retry_5xx: bool = True, **kwargs: Any
    ) -> _T:
        """One API call; 429 (and 5xx unless ``retry_5xx`` is False) retried twice."""
        if self.request_timeout is not None:
            kwargs.setdefault("_request_timeout", self.request_timeout)
        for attempt in range(3):
            try:
                return await fn(*args, **kwargs)
            except ApiException as exc:
                status = exc.status or 0
                if attempt == 2 or not (status == 429 or (retry_5xx and 500 <= status < 600)):
                    raise
                await asyncio.sleep(0.1 * (attempt + 1) ** 2)
        raise AssertionError("unreachable")

    async def call_json(
        self, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """:meth:`call` answered with the plain dict the API sent, parsed once: the generated
        client would build a model object of every item and the caller serialize it back (for a
        listing of Jobs that round trip cost ten times the parse), and parses even a custom
        object's answer with the standard library's json. Every call of this client goes this
        way (a burst's Event posts built a V1Event with parsed timestamps each, only to drop
        it: the operator's CPU per 200-batch burst fell ~10 %)."""

        async def fetch(*fetch_args: Any, **fetch_kwargs: Any) -> dict[str, Any]:
            response = await fn(*fetch_args, _preload_content=False, **fetch_kwargs)
            try:
                data = await response.read()
                if not 200 <= response.status <= 299:
                    error = ApiException(status=response.status, reason=response.reason)
                    error.body = data
                    error.headers = response.headers
                    raise error
                parsed: dict[str, Any] = orjson.loads(data)
                return parsed
            finally:
                response.release()

        return await self.call(fetch, *args, **kwargs)

    # --- custom objects of llmbatch.io ---------------------------------------------------------

    async def get_custom(
        self, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        """One object (``namespace`` None: cluster-scoped), or None when it does not exist."""
        try:
            if namespace is None:
                obj = await self.call_json(
                    self.custom.get_cluster_custom_object, GROUP, VERSION, plural, name
                )
            else:
                obj = await self.call_json(
                    self.custom.get_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    name,
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = obj
        return result

    async def list_custom(
        self, plural: str, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in one namespace, or cluster-wide with None)."""
        return [item async for item in self.iter_custom(plural, namespace, label_selector)]

    async def iter_custom(
        self,
        plural: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every object of a kind, listed in pages (one page in flight per request)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": page_size}
            if token:
                kwargs["_continue"] = token
            if label_selector:
                kwargs["label_selector"] = label_selector
            try:
                # Parsed once by orjson (the generated client's json.loads is slower).
                if namespace is None:
                    listing = await self.call_json(
                        self.custom.list_cluster_custom_object, GROUP, VERSION, plural, **kwargs
                    )
                else:
                    listing = await self.call_json(
                        self.custom.list_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        namespace,
                        plural,
                        **kwargs,
                    )
            except ApiException as exc:
                if exc.status == 404:  # the kind or the namespace does not exist
                    return
                raise
            for item in listing.get("items", []):
                yield item
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return

    async def create_custom(
        self, plural: str, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create a namespaced object; :class:`Conflict` when its name is taken.

        A 503 is tried again for up to :data:`UNAVAILABLE_SECONDS`: the API server says it did
        not serve the request. A fresh install answers so for a few seconds: the admission
        chain's MutatingAdmissionPolicy plugin learns a new kind's schema from ``/openapi/v3``
        on a 5 s poll, and until then refuses every create of that kind the chart's finalizer
        policy matches (Batches) with 503, whatever the policy's ``failurePolicy``. A retry
        cannot make a second object (the name is the same): if an earlier attempt was stored
        after all, the retry meets :class:`Conflict`, as a concurrent creator's would.
        """
        deadline, pause = time.monotonic() + UNAVAILABLE_SECONDS, 0.2
        while True:
            try:
                created: dict[str, Any] = await self.call_json(
                    self.custom.create_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    body,
                    retry_5xx=False,
                )
                return created
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(body["metadata"]["name"]) from exc
                if exc.status != 503 or time.monotonic() + pause > deadline:
                    raise
                log.info(
                    "create of %s %s/%s unavailable (503); again in %.1f s",
                    plural,
                    namespace,
                    body["metadata"]["name"],
                    pause,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def create_or_adopt_custom(
        self, plural: str, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create the object; when its name exists already (a retried step), return that one."""
        for _ in range(2):  # deleted between the 409 and the read: create once more
            try:
                return await self.create_custom(plural, namespace, body)
            except Conflict:
                existing = await self.get_custom(plural, namespace, body["metadata"]["name"])
                if existing is not None:
                    return existing
        return await self.create_custom(plural, namespace, body)

    async def patch_custom(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Merge-patch an object; None when it is gone."""
        try:
            obj: dict[str, Any] = await self.call_json(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                _content_type=_MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def patch_custom_status(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> bool:
        """Merge-patch the status subresource; False when the object is gone."""
        try:
            await self.call_json(
                self.custom.patch_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                _content_type=_MERGE_PATCH,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def patch_custom_at(
        self,
        plural: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        resource_version: str | None,
    ) -> dict[str, Any] | None:
        """Merge-patch the object itself (metadata, spec) as it was at ``resource_version``
        (optimistic concurrency: the API server refuses a patch of a newer object).

        The object written; :class:`Conflict` when it changed since that version; None when
        it is gone."""
        body = dict(patch)
        if resource_version:
            body["metadata"] = {**(body.get("metadata") or {}), "resourceVersion": resource_version}
        try:
            written: dict[str, Any] = await self.call_json(
                self.custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
                _content_type=_MERGE_PATCH,
                retry_5xx=False,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            if exc.status == 404:
                return None
            raise
        return written

    async def replace_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """PUT the status subresource with ``body.metadata.resourceVersion`` as precondition.

        The object written; :class:`Conflict` when it changed since it was read; None when gone.
        """
        try:
            written: dict[str, Any] = await self.call_json(
                self.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body,
                retry_5xx=False,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            if exc.status == 404:
                return None
            raise
        return written

    async def delete_custom(
        self,
        plural: str,
        namespace: str,
        name: str,
        uid: str | None = None,
        *,
        orphan: bool = False,
    ) -> bool:
        """Delete one object (only that incarnation when ``uid`` is given); ``orphan`` keeps
        the objects it owns (the garbage collector drops their owner references instead).

        True when this call deleted it; False when it was already gone or is another object of
        the same name now — both count as done.
        """
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Orphan" if orphan else None,
        )
        try:
            await self.call_json(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                body=body,
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def ensure_cluster_peering(self, name: str) -> None:
        """Create kopf's ClusterKopfPeering object ``name`` unless it exists (409 is success)."""
        body = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": name},
        }
        try:
            await self.call_json(
                self.custom.create_cluster_custom_object,
                "kopf.dev",
                "v1",
                "clusterkopfpeerings",
                body,
                retry_5xx=False,
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    # --- namespaces ----------------------------------------------------------------------------

    async def namespace_annotations(self, namespace: str) -> dict[str, str] | None:
        """The namespace's annotations; None when it does not exist."""
        meta = await self._namespace_meta(namespace)
        return None if meta is None else dict(meta.get("annotations") or {})

    async def namespace_labels(self, namespace: str) -> dict[str, str] | None:
        """The namespace's labels; None when it does not exist."""
        meta = await self._namespace_meta(namespace)
        return None if meta is None else dict(meta.get("labels") or {})

    async def _namespace_meta(self, namespace: str) -> dict[str, Any] | None:
        ns = await self.read_namespace(namespace)
        if ns is None:
            return None
        meta: dict[str, Any] = ns.get("metadata") or {}
        return meta

    async def read_namespace(self, namespace: str) -> dict[str, Any] | None:
        """The Namespace object; None when it does not exist."""
        try:
            return await self.call_json(self.core.read_namespace, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_namespaces(self) -> tuple[list[dict[str, Any]], str]:
        """Every Namespace, and the listing's resourceVersion."""
        listing = await self.call_json(self.core.list_namespace)
        items: list[dict[str, Any]] = list(listing.get("items") or [])
        return items, str((listing.get("metadata") or {}).get("resourceVersion") or "")

    # --- events and secrets --------------------------------------------------------------------

    async def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        """Post one core/v1 Event (``body`` as the API takes it)."""
        await self.call_json(self.core.create_namespaced_event, namespace, body)

    async def post_event(
        self,
        involved: dict[str, str],
        reason: str,
        message: str,
        *,
        warning: bool,
        component: str,
    ) -> bool:
        """An Event on one object (``involved``: apiVersion, kind, namespace, name, uid) outside
        kopf's handlers; False when it could not be posted (an Event is never worth a retry)."""
        body = event_body(involved, reason, message, warning=warning, component=component)
        try:
            await self.create_event(involved["namespace"], body)
        except ApiException:
            return False
        return True

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One Secret as the API sends it (``data`` in base64), or None when it does not exist."""
        try:
            return await self.call_json(self.core.read_namespaced_secret, name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- jobs and pods -------------------------------------------------------------------------

    async def create_or_adopt_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Job; on 409 (it exists: a restarted operator) adopt the existing one."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            return await self.call_json(
                self.batch.create_namespaced_job, namespace, body, retry_5xx=False
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        return await self.call_json(self.batch.read_namespaced_job, name, namespace)

    async def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = await self.call_json(
            self.batch.list_namespaced_job, namespace, label_selector=selector
        )
        return list(listing.get("items") or [])

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self.call_json(self.batch.patch_namespaced_job, name, namespace, patch)

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete a Job and, in the background, its pods; a missing Job is not an error."""
        try:
            await self.call_json(
                self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = await self.call_json(
            self.core.list_namespaced_pod, namespace, label_selector=selector
        )
        return list(listing.get("items") or [])

    async def delete_pods(self, namespace: str, selector: str) -> None:
        """Delete the pods of deleted Jobs that the garbage collector has not reached yet."""
        for pod in await self.list_pods(namespace, selector):
            try:
                await self.call_json(
                    self.core.delete_namespaced_pod, pod["metadata"]["name"], namespace
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise


def event_body(
    involved: dict[str, str], reason: str, message: str, *, warning: bool, component: str
) -> dict[str, Any]:
    """A core/v1 Event about ``involved``, as :meth:`KubeClient.post_event` posts it."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "metadata": {"generateName": f"{component}-", "namespace": involved["namespace"]},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _read_environment_once(api: client.ApiClient, cfg: client.Configuration) -> None:
    """The API client's HTTP session without aiohttp's ``trust_env``, whose per-request reads of
    ``~/.netrc`` and of the proxy variables each cost a hop through a thread (two per API call:
    a profile of the gateway accepting 50 batches a second found them at ~6 % of its samples,
    the operator at ~3 %). The proxy the environment names for the API server (``HTTPS_PROXY``,
    ``NO_PROXY``) is looked up here, once, and set on the client; a netrc entry for the API
    server is not used (the client authenticates with its token or certificate)."""
    rest = api.rest_client
    target = urlsplit(str(cfg.host or ""))
    proxy = getproxies().get(target.scheme)
    if not cfg.proxy and proxy and target.hostname and not proxy_bypass(target.hostname):
        rest.proxy = proxy
    session: aiohttp.ClientSession = rest.pool_manager
    connector = session.connector
    session.detach()  # the connector (its TLS settings and connection limit) moves over
    rest.pool_manager = aiohttp.ClientSession(
        connector=connector, trust_env=False, read_bufsize=READ_BUFSIZE
    )
