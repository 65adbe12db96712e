"""API keys: SHA-256 hashes in labelled Secrets, watched so a revoked key stops working at once.

A key Secret lives in the gateway's namespace, labelled ``llmbatch.io/api-key=true``, with data
``sha256`` (hex digest of the key), ``namespace`` (the tenant), ``namespaceUID`` (the UID of that
namespace when the key was made: a later namespace of the same name is another tenant,
``core.identity``) and ``scopes`` (comma list of ``inference:write``, ``inference:read``). The
plain key is shown once by ``llmbatch keys create`` and never stored. :class:`KeyRing` holds the
digests in memory, kept current by a list + watch (``gateway.reflector``); a key is accepted
only while its namespace is the one it is bound to (:func:`admit`). A key made before keys were
bound carries no UID: it is bound to its namespace at its first use, and the binding is kept in
the store (:meth:`KeyRing.bound`), so a later namespace of the same name never inherits it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any

import orjson

from llmbatch.core import keys
from llmbatch.core.identity import NamespaceIdentity, key_acts_for
from llmbatch.gateway.kube import KEY_LABEL, decode_secret_data
from llmbatch.storage.base import ObjectNotFound, ObjectStore

log = logging.getLogger(__name__)

KEY_PREFIX = "sk-llmb-"
SCOPE_WRITE = "inference:write"
SCOPE_READ = "inference:read"
KNOWN_SCOPES = (SCOPE_WRITE, SCOPE_READ)
UID_FIELD = "namespaceUID"
"""Secret data: the UID of the namespace the key was made for."""
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_UID = re.compile(r"^[0-9A-Za-z-]{1,64}$")


def new_api_key() -> str:
    """A fresh key: ``sk-llmb-`` + 43 URL-safe characters (256 random bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """Hex SHA-256 of a key, the only form in which keys are stored."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_scopes(raw: str) -> frozenset[str]:
    """``"inference:write, inference:read"`` → the known scopes named (unknown ones dropped)."""
    return frozenset(s.strip() for s in raw.split(",") if s.strip() in KNOWN_SCOPES)


def key_secret(
    name: str,
    digest: str,
    namespace: str,
    scopes: list[str],
    gateway_namespace: str,
    namespace_uid: str | None = None,
) -> dict[str, Any]:
    """The Secret manifest of one key (``stringData``; the API server encodes it), bound to the
    namespace's UID when one is given."""
    data = {"sha256": digest, "namespace": namespace, "scopes": ",".join(scopes)}
    if namespace_uid:
        data[UID_FIELD] = namespace_uid
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": gateway_namespace,
            "labels": {KEY_LABEL: "true", "llmbatch.io/tenant": namespace},
        },
        "stringData": data,
    }


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant namespace and what the key may do."""

    namespace: str
    scopes: frozenset[str]
    key_name: str
    namespace_uid: str | None = None
    """The UID of the namespace the key acts for; None: a key made before keys were bound."""

    def can_read(self) -> bool:
        # A write key may also read what it wrote (the seed's "a key with inference:write").
        return SCOPE_READ in self.scopes or SCOPE_WRITE in self.scopes

    def can_write(self) -> bool:
        return SCOPE_WRITE in self.scopes


def principal_of_secret(secret: dict[str, Any]) -> tuple[str, Principal] | None:
    """``(digest, principal)`` of a key Secret, or None when it is malformed."""
    data = decode_secret_data(secret)
    digest = data.get("sha256", "").strip().lower()
    namespace = data.get("namespace", "").strip()
    uid = data.get(UID_FIELD, "").strip() or None
    if not _HEX64.match(digest) or not _DNS_LABEL.match(namespace):
        return None
    if uid is not None and not _UID.match(uid):
        return None
    name = str((secret.get("metadata") or {}).get("name", ""))
    return digest, Principal(namespace, parse_scopes(data.get("scopes", "")), name, uid)


def is_key_secret(secret: dict[str, Any]) -> bool:
    """Whether a Secret is an API key of this gateway: labelled as one and holding a key's
    data (``llmbatch keys revoke`` deletes nothing else)."""
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(KEY_LABEL) == "true" and principal_of_secret(secret) is not None


class KeyRing:
    """The current keys, by Secret name; lookups compare digests in constant time."""

    def __init__(self) -> None:
        self._by_secret: dict[str, tuple[bytes, Principal]] = {}
        self._bound: dict[tuple[str, str], str] = {}
        """Keys without a UID in their Secret, as bound at their first use: (Secret name,
        namespace) -> UID (the store keeps the binding, this the reads of it)."""
        self.loaded = False

    def __len__(self) -> int:
        return len(self._by_secret)

    def replace(self, objects: list[dict[str, Any]]) -> None:
        fresh: dict[str, tuple[bytes, Principal]] = {}
        for secret in objects:
            entry = principal_of_secret(secret)
            if entry is not None:
                fresh[entry[1].key_name] = (bytes.fromhex(entry[0]), entry[1])
        self._by_secret = fresh
        self.loaded = True

    def apply(self, kind: str, secret: dict[str, Any]) -> None:
        name = str((secret.get("metadata") or {}).get("name", ""))
        entries = dict(self._by_secret)
        entries.pop(name, None)
        if kind != "DELETED":
            entry = principal_of_secret(secret)
            if entry is not None:
                entries[name] = (bytes.fromhex(entry[0]), entry[1])
        self._by_secret = entries  # swapped whole: readers never see a half-applied change

    def authenticate(self, key: str) -> Principal | None:
        """The principal of ``key``, or None. Every stored digest is compared (no early exit)."""
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        found: Principal | None = None
        for stored, principal in self._by_secret.values():
            if hmac.compare_digest(stored, digest):
                found = principal
        return found

    async def bound(
        self, principal: Principal, tenant: NamespaceIdentity | None, store: ObjectStore
    ) -> Principal:
        """``principal`` with the UID its key is bound to: its Secret's; for a key made before
        keys were bound, the binding stored at its first use — or, at its first use now, the
        UID of ``tenant`` (its namespace as it is), stored (``keybindings/<Secret name>``)."""
        if principal.namespace_uid is not None:
            return principal
        uid = self._bound.get((principal.key_name, principal.namespace))
        if uid is None and tenant is not None and tenant.live:
            uid = await asyncio.to_thread(_stored_binding, store, principal, tenant)
            self._bound[principal.key_name, principal.namespace] = uid
        return principal if uid is None else replace(principal, namespace_uid=uid)


def admit(principal: Principal, tenant: NamespaceIdentity | None) -> Principal | None:
    """``principal`` when its key may act for ``tenant`` (its namespace as it is now), else
    None (``core.identity.key_acts_for``)."""
    return principal if key_acts_for(tenant, principal.namespace_uid) else None


def _stored_binding(store: ObjectStore, principal: Principal, tenant: NamespaceIdentity) -> str:
    """The UID an unbound key was bound to at its first use; a first use binds it to
    ``tenant`` (blocking: run in a thread)."""
    key = keys.key_binding_key(principal.key_name)
    try:
        stored = orjson.loads(store.get(key))
    except (ObjectNotFound, orjson.JSONDecodeError):
        stored = None
    if isinstance(stored, dict) and stored.get("namespace") == principal.namespace:
        uid = stored.get("uid")
        if isinstance(uid, str) and uid:
            return uid
    store.put(key, orjson.dumps({"namespace": principal.namespace, "uid": tenant.uid}))
    log.info("key %s: bound to namespace %s (uid %s) at its first use",
             principal.key_name, tenant.name, tenant.uid)  # fmt: skip
    return tenant.uid
