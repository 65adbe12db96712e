"""The one Kubernetes client layer of the operator and the gateway (never the executor):
:class:`KubeClient` (``client``) and the conditional status update (``status``)."""

from llmbatch.kube.client import Conflict, KubeClient
from llmbatch.kube.status import Contended, merged, status_replacement, update_status

__all__ = [
    "Conflict",
    "Contended",
    "KubeClient",
    "merged",
    "status_replacement",
    "update_status",
]
