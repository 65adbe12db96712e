"""Configuration of a dev cluster (nodes, extra components) and the supervisor's status file.

Kept free of the Kubernetes client so that starting/stopping a cluster imports quickly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
CONFIG_FILE = "config.json"
STATUS_FILE = "status.json"


@dataclass(frozen=True)
class NodeSpec:
    """One fake GPU node. Quantities are Kubernetes quantity strings."""

    name: str
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    gpus: int = 8
    gpu_product: str = DEFAULT_GPU_PRODUCT
    gpu_memory_mib: int = 81920
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()

    def all_labels(self) -> dict[str, str]:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "devcluster",
            "llmbatch.io/devcluster": "true",
        }
        if self.gpus:
            labels |= {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": self.gpu_product,
                "nvidia.com/gpu.count": str(self.gpus),
                "nvidia.com/gpu.memory": str(self.gpu_memory_mib),
            }
        return labels | dict(self.labels)

    def resources(self) -> dict[str, str]:
        res = {
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": str(self.pods),
            "ephemeral-storage": "500Gi",
        }
        if self.gpus:
            res["nvidia.com/gpu"] = str(self.gpus)
        return res

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cpu": self.cpu,
            "memory": self.memory,
            "pods": self.pods,
            "gpus": self.gpus,
            "gpu_product": self.gpu_product,
            "gpu_memory_mib": self.gpu_memory_mib,
            "labels": dict(self.labels),
            "taints": [dict(t) for t in self.taints],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NodeSpec:
        return cls(
            name=str(data["name"]),
            cpu=str(data.get("cpu", "32")),
            memory=str(data.get("memory", "256Gi")),
            pods=int(data.get("pods", 110)),
            gpus=int(data.get("gpus", 8)),
            gpu_product=str(data.get("gpu_product", DEFAULT_GPU_PRODUCT)),
            gpu_memory_mib=int(data.get("gpu_memory_mib", 81920)),
            labels=dict(data.get("labels") or {}),
            taints=[dict(t) for t in data.get("taints") or []],
        )


def gpu_nodes(
    count: int, *, gpus: int = 8, prefix: str = "gpu-node", gpu_product: str = DEFAULT_GPU_PRODUCT
) -> list[NodeSpec]:
    """``count`` identical GPU nodes named ``<prefix>-0`` …"""
    return [
        NodeSpec(name=f"{prefix}-{i}", gpus=gpus, gpu_product=gpu_product) for i in range(count)
    ]


@dataclass
class ComponentSpec:
    """An extra process the supervisor runs once the cluster (API + nodes) is ready.

    ``command`` and ``env`` values may use ``{kubeconfig}``, ``{state_dir}``, ``{server}`` and
    ``{python}`` (this interpreter). ``ready_url``, when set, is polled (plain HTTP GET, 2xx/3xx)
    before the next component starts; ``ready_file`` waits for a file to exist.
    """

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    ready_url: str | None = None
    ready_file: str | None = None
    ready_timeout: float = 60.0
    stop_grace: float = 10.0

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "env": self.env,
            "cwd": self.cwd,
            "ready_url": self.ready_url,
            "ready_file": self.ready_file,
            "ready_timeout": self.ready_timeout,
            "stop_grace": self.stop_grace,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ComponentSpec:
        return cls(
            name=str(data["name"]),
            command=[str(a) for a in data["command"]],
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            cwd=data.get("cwd"),
            ready_url=data.get("ready_url"),
            ready_file=data.get("ready_file"),
            ready_timeout=float(data.get("ready_timeout", 60.0)),
            stop_grace=float(data.get("stop_grace", 10.0)),
        )


@dataclass
class ClusterConfig:
    """Everything a supervisor needs; saved as ``state_dir/config.json``."""

    state_dir: Path
    nodes: list[NodeSpec] = field(default_factory=lambda: gpu_nodes(2))
    components: list[ComponentSpec] = field(default_factory=list)
    binary: Path | None = None
    controlplane_args: list[str] = field(default_factory=list)
    pod_env: dict[str, str] = field(default_factory=dict)
    start_timeout: float = 120.0

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def save(self) -> Path:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / CONFIG_FILE
        data = {
            "state_dir": str(self.state_dir),
            "nodes": [n.to_json() for n in self.nodes],
            "components": [c.to_json() for c in self.components],
            "binary": str(self.binary) if self.binary else None,
            "controlplane_args": self.controlplane_args,
            "pod_env": self.pod_env,
            "start_timeout": self.start_timeout,
        }
        path.write_text(json.dumps(data, indent=2))
        return path

    @classmethod
    def load(cls, state_dir: Path) -> ClusterConfig:
        data = json.loads((state_dir / CONFIG_FILE).read_text())
        return cls(
            state_dir=Path(data["state_dir"]),
            nodes=[NodeSpec.from_json(n) for n in data["nodes"]],
            components=[ComponentSpec.from_json(c) for c in data.get("components") or []],
            binary=Path(data["binary"]) if data.get("binary") else None,
            controlplane_args=list(data.get("controlplane_args") or []),
            pod_env=dict(data.get("pod_env") or {}),
            start_timeout=float(data.get("start_timeout", 120.0)),
        )


def write_status(state_dir: Path, **fields: Any) -> None:
    path = state_dir / STATUS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(fields, indent=2))
    tmp.replace(path)


def read_status(state_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((state_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
