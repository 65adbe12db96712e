"""The project's Kubernetes client (kubernetes_asyncio) for a dev-cluster kubeconfig."""

from __future__ import annotations

from pathlib import Path

from kubernetes_asyncio import client, config


async def api_client(kubeconfig: Path | str) -> client.ApiClient:
    """An async Kubernetes API client for a kubeconfig file (``await api.close()`` when done)."""
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration=configuration)
