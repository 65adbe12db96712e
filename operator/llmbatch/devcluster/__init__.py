"""A local Kubernetes control plane and a process-based GPU node agent, for development and tests.

``ClusterConfig`` + ``DevCluster.start`` run everything in a supervisor process (``llmbatch dev up``
and the pytest fixtures); the pieces (``ControlPlane``, ``NodeAgent``) are usable on their own.
``NodeAgent`` and ``api_client`` pull in the Kubernetes client and are imported on first use.
See docs/devcluster.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from llmbatch.devcluster.cluster import DevCluster, DevClusterError
from llmbatch.devcluster.config import ClusterConfig, ComponentSpec, NodeSpec, gpu_nodes
from llmbatch.devcluster.containers import TERMINATION_MESSAGE_ENV
from llmbatch.devcluster.controlplane import (
    ControlPlane,
    ControlPlaneError,
    kubectl_binary,
    repo_root,
    testcluster_binary,
)
from llmbatch.devcluster.procs import MARKER_ENV

if TYPE_CHECKING:
    from llmbatch.devcluster.kubeclient import api_client
    from llmbatch.devcluster.nodeagent import NodeAgent

_LAZY = {
    "api_client": "llmbatch.devcluster.kubeclient",
    "NodeAgent": "llmbatch.devcluster.nodeagent",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(name)
    return getattr(importlib.import_module(module), name)


__all__ = [
    "MARKER_ENV",
    "TERMINATION_MESSAGE_ENV",
    "ClusterConfig",
    "ComponentSpec",
    "ControlPlane",
    "ControlPlaneError",
    "DevCluster",
    "DevClusterError",
    "NodeAgent",
    "NodeSpec",
    "api_client",
    "gpu_nodes",
    "kubectl_binary",
    "repo_root",
    "testcluster_binary",
]
