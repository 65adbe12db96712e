"""A container's argv, environment and working directory, as a kubelet builds them: ``envFrom``,
``env`` with ``$(VAR)`` expansion and ``valueFrom`` (Secrets, ConfigMaps, the downward API),
the termination-message path rewrite and the service-account token volume."""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from llmbatch.devcluster.containers import (
    DEFAULT_TERMINATION_MESSAGE_PATH,
    TERMINATION_MESSAGE_ENV,
    Container,
)
from llmbatch.devcluster.expansion import expand
from llmbatch.devcluster.podcontext import JSON, ContainerConfigError, PodContext
from llmbatch.devcluster.procs import MARKER_ENV
from llmbatch.devcluster.satokens import ServiceAccountVolumes

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_LABEL_OR_ANNOTATION = re.compile(r"metadata\.(labels|annotations)\['([^']*)'\]")


def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity (``500m``, ``4Gi``, ``2``) as a Decimal."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"invalid quantity {text!r}")
    return Decimal(match.group(1)) * _SUFFIX[match.group(2)]


def resolve_command(argv: list[str], path: str | None) -> list[str]:
    """``python``/``python3`` run the current interpreter (the project venv); other names go
    through PATH."""
    if not argv:
        return argv
    head = argv[0]
    if _PYTHON.fullmatch(head):
        return [sys.executable, *argv[1:]]
    if os.sep not in head:
        found = shutil.which(head, path=path)
        if found:
            return [found, *argv[1:]]
    return argv


def decode_secret(data: Mapping[str, str] | None) -> dict[str, str]:
    """A Secret's base64 ``data`` as text."""
    out: dict[str, str] = {}
    for key, value in (data or {}).items():
        out[key] = base64.b64decode(value).decode(errors="replace")
    return out


@dataclass(frozen=True)
class Launch:
    """How to start one container process."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


class PodEnvironment:
    """Builds the :class:`Launch` of a pod's containers from the pod as it is now."""

    def __init__(
        self, pod: JSON, ctx: PodContext, directory: Path, containers: Sequence[Container]
    ) -> None:
        self.pod = pod
        self.ctx = ctx
        self.namespace: str = pod["metadata"]["namespace"]
        self.containers = containers
        self.tokens = ServiceAccountVolumes(pod, ctx, directory, self.field)

    async def launch(self, c: Container) -> Launch:
        """argv, env and cwd of ``c``; ContainerConfigError when it cannot start yet."""
        spec = c.spec
        term_path = spec.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        term_file = str(c.termination_file)
        env: dict[str, str] = dict(self.ctx.base_env)
        env["HOSTNAME"] = self.pod["metadata"]["name"]
        env[MARKER_ENV] = self.ctx.marker
        env[TERMINATION_MESSAGE_ENV] = term_file
        declared: dict[str, str] = {}
        for source in spec.get("envFrom") or []:
            declared.update(await self._env_from(source))
        for var in spec.get("env") or []:
            if "valueFrom" in var:
                value = await self._value_from(var["valueFrom"], c)
                if value is None:
                    continue
            else:
                value = expand(var.get("value") or "", {**env, **declared})
            declared[var["name"]] = value.replace(term_path, term_file)
        env.update(await self.tokens.env(spec, declared))
        env.update(declared)
        command = [expand(a, env) for a in spec.get("command") or []]
        args = [expand(a, env) for a in spec.get("args") or []]
        if not command:
            raise ContainerConfigError(
                f"container {c.name} has no command: images are not run, so the image's "
                "entrypoint is unknown; set command"
            )
        argv = [a.replace(term_path, term_file) for a in [*command, *args]]
        cwd = spec.get("workingDir") or str(c.directory)
        try:
            Path(cwd).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise ContainerConfigError(f"workingDir {cwd}: {err}") from err
        return Launch(resolve_command(argv, env.get("PATH")), env, cwd)

    async def _env_from(self, source: JSON) -> dict[str, str]:
        prefix = source.get("prefix") or ""
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data = await self.ctx.read_object(kind, self.namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    return {}
                raise ContainerConfigError(f'{kind.lower()} "{ref["name"]}" not found')
            return {prefix + k: v for k, v in data.items()}
        return {}

    async def _value_from(self, source: JSON, c: Container) -> str | None:
        for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data = await self.ctx.read_object(kind, self.namespace, ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                what = f'{kind.lower()} "{ref["name"]}"'
                raise ContainerConfigError(
                    f"{what} not found" if data is None else f'key "{ref["key"]}" not in {what}'
                )
            return data[ref["key"]]
        if "fieldRef" in source:
            return self.field(source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return self._resource_field(source["resourceFieldRef"], c)
        raise ContainerConfigError(f"unsupported valueFrom {sorted(source)}")

    def field(self, path: str) -> str:
        """A downward-API ``fieldPath`` of the pod."""
        meta = self.pod["metadata"]
        spec = self.pod["spec"]
        match = _LABEL_OR_ANNOTATION.fullmatch(path)
        if match:
            return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
        if path in ("metadata.labels", "metadata.annotations"):
            items = meta.get(path.split(".")[1]) or {}
            return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(items.items()))
        simple = {
            "metadata.name": meta.get("name"),
            "metadata.namespace": meta.get("namespace"),
            "metadata.uid": meta.get("uid"),
            "spec.nodeName": spec.get("nodeName"),
            "spec.serviceAccountName": spec.get("serviceAccountName"),
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
        }
        if path not in simple:
            raise ContainerConfigError(f"unsupported fieldRef {path}")
        return str(simple[path] or "")

    def _resource_field(self, ref: JSON, c: Container) -> str:
        target = c.spec
        if ref.get("containerName"):
            for other in self.containers:
                if other.name == ref["containerName"]:
                    target = other.spec
        kind, _, resource = str(ref["resource"]).partition(".")
        resources = target.get("resources") or {}
        value = (resources.get(kind) or {}).get(resource)
        if value is None and kind == "requests":
            value = (resources.get("limits") or {}).get(resource)
        if value is None:
            value = self.ctx.node_allocatable.get(resource, "0")
        divisor = parse_quantity(ref.get("divisor") or "1")
        return str(math.ceil(parse_quantity(value) / divisor))
