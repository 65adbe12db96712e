"""API keys: SHA-256 hashes in labelled Secrets, watched so a revoked key stops working at once.

A key Secret lives in the gateway's namespace, labelled ``llmbatch.io/api-key=true``, with data
``sha256`` (hex digest of the key), ``namespace`` (the tenant) and ``scopes`` (comma list of
``inference:write``, ``inference:read``). The plain key is shown once by ``llmbatch keys create``
and never stored. :class:`KeyRing` holds the digests in memory, kept current by
:class:`KeyWatcher` (a watch with a full re-list every resync period).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from typing import Any

from llmbatch.gateway.kube import KEY_LABEL, KubeAPI, decode_secret_data

log = logging.getLogger(__name__)

KEY_PREFIX = "sk-llmb-"
SCOPE_WRITE = "inference:write"
SCOPE_READ = "inference:read"
KNOWN_SCOPES = (SCOPE_WRITE, SCOPE_READ)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


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
    name: str, digest: str, namespace: str, scopes: list[str], gateway_namespace: str
) -> dict[str, Any]:
    """The Secret manifest of one key (``stringData``; the API server encodes it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": gateway_namespace,
            "labels": {KEY_LABEL: "true", "llmbatch.io/tenant": namespace},
        },
        "stringData": {"sha256": digest, "namespace": namespace, "scopes": ",".join(scopes)},
    }


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant namespace and what the key may do."""

    namespace: str
    scopes: frozenset[str]
    key_name: str

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
    if not _HEX64.match(digest) or not _DNS_LABEL.match(namespace):
        return None
    name = str((secret.get("metadata") or {}).get("name", ""))
    return digest, Principal(namespace, parse_scopes(data.get("scopes", "")), name)


class KeyRing:
    """The current keys, by Secret name; lookups compare digests in constant time."""

    def __init__(self) -> None:
        self._by_secret: dict[str, tuple[bytes, Principal]] = {}
        self.loaded = False

    def __len__(self) -> int:
        return len(self._by_secret)

    def replace(self, secrets_: list[dict[str, Any]]) -> None:
        fresh: dict[str, tuple[bytes, Principal]] = {}
        for secret in secrets_:
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


class KeyWatcher:
    """Keeps a :class:`KeyRing` equal to the key Secrets: list, watch, re-list on every resync."""

    def __init__(self, kube: KubeAPI, namespace: str, ring: KeyRing, resync_seconds: int) -> None:
        self.kube = kube
        self.namespace = namespace
        self.ring = ring
        self.resync_seconds = resync_seconds
        self._task: asyncio.Task[None] | None = None
        self.first_sync = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="key-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                items, version = await self.kube.list_key_secrets(self.namespace)
                self.ring.replace(items)
                self.first_sync.set()
                backoff = 0.5
                async for kind, secret in self.kube.watch_key_secrets(
                    self.namespace, version, self.resync_seconds
                ):
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self.ring.apply(kind, secret)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep serving the last known keys; retry soon
                log.warning("key watch failed (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
