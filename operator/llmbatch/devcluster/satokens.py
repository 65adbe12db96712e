"""Service-account tokens: the projected ``kube-api-access-*`` volume, the way this agent can
mount it.

A kubelet mounts that projected volume (token, ca.crt, namespace) at
/var/run/secrets/kubernetes.io/serviceaccount. Processes on a shared host cannot each own that
path, so the agent writes the volume under the pod's directory and points ``KUBECONFIG`` at a
kubeconfig holding the same token: Kubernetes clients fall back to it when there is no in-cluster
token file. The token is a real TokenRequest for the pod's service account, bound to the pod, so
the API server applies that account's RBAC.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from llmbatch.devcluster.podcontext import JSON, ContainerConfigError, PodContext

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_EXPIRATION_SECONDS = 3607


class ServiceAccountVolumes:
    """Writes a pod's projected token volumes under ``directory/volumes/<volume>/``."""

    def __init__(
        self, pod: JSON, ctx: PodContext, directory: Path, field: Callable[[str], str]
    ) -> None:
        self.pod = pod
        self.ctx = ctx
        self.directory = directory
        self.field = field
        """Resolves a downward-API ``fieldPath`` (for the volume's ``namespace`` item)."""

    async def env(self, container: JSON, declared: Mapping[str, str]) -> dict[str, str]:
        """``KUBECONFIG`` for a container mounting a token volume (unless it sets its own)."""
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            sources = ((volume or {}).get("projected") or {}).get("sources") or []
            token_source = next(
                (s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s), None
            )
            if token_source is None or "KUBECONFIG" in declared:
                continue
            kubeconfig = await self.project(mount["name"], sources, token_source)
            return {"KUBECONFIG": str(kubeconfig)}
        return {}

    async def project(self, volume: str, sources: list[JSON], token_source: JSON) -> Path:
        """Write the volume once (token, ca.crt, namespace, a kubeconfig); the kubeconfig."""
        directory = self.directory / "volumes" / volume
        kubeconfig = directory / "kubeconfig"
        if kubeconfig.exists():
            return kubeconfig
        if self.ctx.request_token is None:
            raise ContainerConfigError(f"volume {volume}: this node cannot mint tokens")
        account = self.pod["spec"].get("serviceAccountName") or "default"
        try:
            token = await self.ctx.request_token(
                self.pod,
                account,
                int(token_source.get("expirationSeconds") or DEFAULT_EXPIRATION_SECONDS),
                token_source.get("audience"),
            )
        except Exception as err:
            raise ContainerConfigError(f"volume {volume}: token for {account}: {err}") from err
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        token_file = directory / str(token_source.get("path") or "token")
        token_file.write_text(token)
        token_file.chmod(0o600)
        self._write_items(directory, sources)
        ca_file = directory / "devcluster-ca.crt"
        ca_file.write_bytes(self.ctx.ca_data)
        config = token_kubeconfig(
            self.ctx.server, ca_file, account, token, self.pod["metadata"]["namespace"]
        )
        tmp = kubeconfig.with_suffix(".tmp")
        tmp.write_text(json.dumps(config))
        tmp.chmod(0o600)
        tmp.replace(kubeconfig)
        return kubeconfig

    def _write_items(self, directory: Path, sources: list[JSON]) -> None:
        for source in sources:
            for item in (source.get("configMap") or {}).get("items") or []:
                if item.get("key") == "ca.crt":
                    (directory / item["path"]).write_bytes(self.ctx.ca_data)
            for item in (source.get("downwardAPI") or {}).get("items") or []:
                field_path = (item.get("fieldRef") or {}).get("fieldPath")
                if field_path:
                    (directory / item["path"]).write_text(self.field(field_path))


def token_kubeconfig(server: str, ca_file: Path, account: str, token: str, namespace: str) -> JSON:
    """A kubeconfig that authenticates as ``account`` with ``token``."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "in-cluster",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {
                "name": "in-cluster",
                "context": {"cluster": "in-cluster", "user": account, "namespace": namespace},
            }
        ],
        "current-context": "in-cluster",
    }
