"""The operator's view of the project's Kubernetes client (:mod:`llmbatch.kube`).

kopf does its own watching; everything else the operator reads or writes goes through
:class:`Kube`, so the event loop never blocks on a synchronous client.
"""

from __future__ import annotations

from llmbatch.kube import Conflict, KubeClient

REQUEST_TIMEOUT = 60.0
"""Seconds per API call: a hung API server fails the step; the next reconcile retries."""


class Kube(KubeClient):
    """:class:`KubeClient` with the operator's verbs on Jobs."""

    async def set_job_suspended(self, namespace: str, name: str, suspend: bool) -> None:
        await self.patch_job(namespace, name, {"spec": {"suspend": suspend}})

    async def annotate_job(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.patch_job(namespace, name, {"metadata": {"annotations": annotations}})


__all__ = ["Conflict", "Kube"]
