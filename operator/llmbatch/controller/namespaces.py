"""The tenant namespaces' settings, kept from a watch (no read per step or round).

A tenant is a namespace; what the operator reads of it are annotations: the fair-share weight
in every pool (``core.scheduling.WEIGHT_ANNOTATION``) and whether expedited batches are allowed
(``core.tiers``); labels: which pools serve it (``core.tenancy``); and its identity, the UID
archived records are bound to (``core.identity``). kopf watches the
namespaces and hands each change to :meth:`notice`; a namespace the watch has not shown yet (the
operator just started) reads as unknown, and callers that must not guess fall back to a GET.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmbatch.core.identity import NamespaceIdentity
from llmbatch.core.scheduling import tenant_weight


class NamespaceCache:
    """Annotations, labels and identity of every namespace, by name."""

    def __init__(self) -> None:
        self._annotations: dict[str, dict[str, str]] = {}
        self._labels: dict[str, dict[str, str]] = {}
        self._identities: dict[str, NamespaceIdentity] = {}

    def notice(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name:
            return
        if deleted:
            self._annotations.pop(name, None)
            self._labels.pop(name, None)
            self._identities.pop(name, None)
            return
        identity = NamespaceIdentity.of(body)
        if identity is not None:
            self._identities[name] = identity
        self._annotations[name] = {
            str(k): str(v) for k, v in (meta.get("annotations") or {}).items()
        }
        self._labels[name] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}

    def annotations(self, name: str) -> dict[str, str] | None:
        """The namespace's annotations; None when the watch has not shown it."""
        return self._annotations.get(name)

    def labels(self, name: str) -> dict[str, str] | None:
        """The namespace's labels (which pools serve it); None when the watch has not shown it."""
        return self._labels.get(name)

    def identity(self, name: str) -> NamespaceIdentity | None:
        """Which namespace of that name exists (its UID); None when the watch has not shown
        one."""
        return self._identities.get(name)

    def weight(self, name: str) -> float:
        """The tenant's fair-share weight (1 for a namespace not seen yet)."""
        return tenant_weight(self._annotations.get(name))
