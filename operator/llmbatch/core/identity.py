"""A tenant is a namespace as Kubernetes identifies it: its name *and* its UID.

A namespace's name is reused: delete ``team-a`` and create ``team-a`` again and the API server
gives the new one another UID. Everything that outlives the objects of a namespace — API keys
(Secrets in the gateway's keys namespace), archived batch records and bytes in the store — is
bound to the UID, so the new namespace inherits neither the old one's keys nor its history:

- an API key carries the UID of the namespace it was made for (``llmbatch keys create`` reads
  it); it acts only while that namespace exists and is not being deleted (:func:`key_acts_for`);
- an archived record carries the UID of the namespace it was archived from
  (:data:`TENANT_UID_FIELD`); a record is shown only to that namespace (:func:`record_belongs`).

Keys and records made before this rule carry no UID. A record without one belongs to the
namespace only when its batch was created after the namespace was (every batch of an earlier
namespace of that name was created before it was deleted, so before this one existed); a key
without one is bound to the namespace it finds at its first use (``gateway.auth``) until
``llmbatch keys bind`` writes the binding into its Secret (docs/upgrading.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch.core.lifecycle import unix_seconds

TENANT_UID_FIELD = "tenantUID"
"""Top-level field of an archived record: the UID of the namespace it was archived from."""


@dataclass(frozen=True)
class NamespaceIdentity:
    """One namespace as it is now: which one (its UID), since when, and whether it is going."""

    name: str
    uid: str
    created_at: int
    """Unix seconds of its ``creationTimestamp``."""
    deleted_at: int | None = None
    """Unix seconds of its ``deletionTimestamp``: it is being deleted."""

    @property
    def live(self) -> bool:
        """Not being deleted: its tenant may act."""
        return self.deleted_at is None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> NamespaceIdentity | None:
        """The identity of a Namespace object; None when it has no name or UID."""
        meta = obj.get("metadata") or {}
        name, uid = meta.get("name"), meta.get("uid")
        if not isinstance(name, str) or not name or not isinstance(uid, str) or not uid:
            return None
        return cls(name, uid, _stamp(meta.get("creationTimestamp")) or 0, _stamp_or_none(meta))


def _stamp(raw: Any) -> int | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return unix_seconds(raw)
    except ValueError:
        return None


def _stamp_or_none(meta: Mapping[str, Any]) -> int | None:
    if not meta.get("deletionTimestamp"):
        return None
    return _stamp(meta.get("deletionTimestamp")) or 0


def key_acts_for(namespace: NamespaceIdentity | None, bound_uid: str | None) -> bool:
    """Whether a key of this namespace may act now: the namespace exists, is not being
    deleted, and is the one the key was made for (a key without a UID: whichever it is)."""
    if namespace is None or not namespace.live:
        return False
    return bound_uid is None or bound_uid == namespace.uid


def record_belongs(namespace: NamespaceIdentity | None, record: Mapping[str, Any]) -> bool:
    """Whether an archived record (or a Batch object) is of this namespace and not of an
    earlier one of the same name (see the module docstring)."""
    if namespace is None:
        return False
    uid = record.get(TENANT_UID_FIELD)
    if isinstance(uid, str) and uid:
        return uid == namespace.uid
    created = _stamp((record.get("metadata") or {}).get("creationTimestamp"))
    return created is not None and created >= namespace.created_at
