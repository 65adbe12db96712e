"""The operator's Kubernetes calls, through one asyncio client (``kubernetes_asyncio``).

kopf does its own watching; everything the operator reads or writes besides the object a handler
got goes through :class:`Kube`, so the event loop never blocks on a synchronous client.
Objects come back as plain camelCase dicts.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from llmbatch.api.resources import GROUP, VERSION


class Conflict(Exception):
    """The object changed since it was read (optimistic concurrency): re-read and retry."""


class Kube:
    """Thin typed wrappers over the API calls the operator makes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    async def connect(cls, kubeconfig: str | None = None) -> Kube:
        """In-cluster credentials when running in a pod, else the kubeconfig."""
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            return cls(client.ApiClient())
        cfg = client.Configuration()
        await config.load_kube_config(
            config_file=kubeconfig or os.environ.get("KUBECONFIG"), client_configuration=cfg
        )
        return cls(client.ApiClient(configuration=cfg))

    async def close(self) -> None:
        await self.api.close()

    def _plain(self, obj: Any) -> dict[str, Any]:
        result: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return result

    # --- custom objects ------------------------------------------------------------------------

    async def get_custom(
        self, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        try:
            if namespace is None:
                obj = await self.custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
            else:
                obj = await self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, name
                )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        result: dict[str, Any] = obj
        return result

    async def list_custom(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            listing = await self.custom.list_cluster_custom_object(GROUP, VERSION, plural)
        else:
            listing = await self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, plural
            )
        items: list[dict[str, Any]] = listing.get("items", [])
        return items

    async def iter_custom(
        self, plural: str, namespace: str | None = None, page_size: int = 500
    ) -> AsyncIterator[dict[str, Any]]:
        """Every object of a kind, listed in pages (one page in flight per request)."""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": page_size}
            if token:
                kwargs["_continue"] = token
            if namespace is None:
                listing = await self.custom.list_cluster_custom_object(
                    GROUP, VERSION, plural, **kwargs
                )
            else:
                listing = await self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, **kwargs
                )
            for item in listing.get("items", []):
                yield item
            token = (listing.get("metadata") or {}).get("continue")
            if not token:
                return

    async def patch_custom_status(
        self, plural: str, namespace: str, name: str, patch: dict[str, Any]
    ) -> bool:
        """Merge-patch the status subresource; False when the object is gone."""
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                plural,
                name,
                patch,
                # A dict body would go as a JSON patch otherwise (the stubs omit this parameter).
                _content_type="application/merge-patch+json",  # type: ignore[call-arg]
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete_custom(
        self, plural: str, namespace: str, name: str, uid: str | None = None
    ) -> bool:
        """Delete one object (only that incarnation when ``uid`` is given).

        True when this call deleted it; False when it was already gone or is another object of
        the same name now — both count as done.
        """
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None
        )
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, body=body
            )
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True

    async def create_or_adopt_custom(
        self, plural: str, namespace: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """Create the object; when its name exists already (a retried step), return that one."""
        try:
            created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body
            )
            return created
        except ApiException as exc:
            if exc.status != 409:
                raise
        existing = await self.get_custom(plural, namespace, body["metadata"]["name"])
        if existing is None:  # deleted in between: try once more
            created = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body
            )
            return created
        return existing

    async def replace_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> bool:
        """PUT the status subresource with ``body.metadata.resourceVersion`` as precondition.

        :class:`Conflict` when the object changed since it was read; False when it is gone.
        """
        try:
            await self.custom.replace_namespaced_custom_object_status(
                GROUP, VERSION, namespace, plural, name, body
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(name) from exc
            if exc.status == 404:
                return False
            raise
        return True

    # --- namespaces ----------------------------------------------------------------------------

    async def ensure_cluster_peering(self, name: str) -> None:
        """Create kopf's ClusterKopfPeering object ``name`` unless it exists (409 is success)."""
        body = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": name},
        }
        try:
            await self.custom.create_cluster_custom_object(
                "kopf.dev", "v1", "clusterkopfpeerings", body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise

    async def namespace_annotations(self, namespace: str) -> dict[str, str]:
        try:
            ns = await self.core.read_namespace(namespace)
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return dict(ns.metadata.annotations or {})

    # --- jobs and pods -------------------------------------------------------------------------

    async def create_or_adopt_job(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a Job; on 409 (it exists: a restarted operator) adopt the existing one."""
        namespace = body["metadata"]["namespace"]
        try:
            job = await self.batch.create_namespaced_job(namespace, body)  # type: ignore[arg-type]
            return self._plain(job)
        except ApiException as exc:
            if exc.status != 409:
                raise
        return self._plain(
            await self.batch.read_namespaced_job(body["metadata"]["name"], namespace)
        )

    async def list_jobs(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = await self.batch.list_namespaced_job(namespace, label_selector=selector)
        return [self._plain(job) for job in listing.items]

    async def set_job_suspended(self, namespace: str, name: str, suspend: bool) -> None:
        await self.batch.patch_namespaced_job(name, namespace, {"spec": {"suspend": suspend}})

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.batch.patch_namespaced_job(
            name, namespace, {"metadata": {"annotations": annotations}}
        )

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        listing = await self.core.list_namespaced_pod(namespace, label_selector=selector)
        return [self._plain(pod) for pod in listing.items]

    async def delete_pods(self, namespace: str, selector: str) -> None:
        """Delete the pods of deleted Jobs that the garbage collector has not reached yet."""
        for pod in await self.list_pods(namespace, selector):
            try:
                await self.core.delete_namespaced_pod(pod["metadata"]["name"], namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise
