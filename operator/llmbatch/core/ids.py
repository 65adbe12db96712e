"""Deterministic identifiers: a retry or a restarted executor never mints a new id."""

from __future__ import annotations

import hashlib

_HEX = 32  # 128 bits, as unguessable as a random id once the batch uid is secret


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))  # length-prefixed: ("ab","c") != ("a","bc")
        h.update(data)
    return h.hexdigest()[:_HEX]


def batch_request_id(batch_uid: str, custom_id: str) -> str:
    """The ``id`` of a result line: ``batch_req_`` + 32 hex from the batch uid and custom_id."""
    return "batch_req_" + _digest("batch_req", batch_uid, custom_id)


def request_id(batch_uid: str, custom_id: str) -> str:
    """The ``response.request_id`` of a result line, derived like :func:`batch_request_id`."""
    return "req_" + _digest("req", batch_uid, custom_id)


def batch_object_name(batch_id: str) -> str:
    """Kubernetes object name of a batch: ``batch_<suffix>`` → ``batch-<suffix>``."""
    if not batch_id.startswith("batch_"):
        raise ValueError(f"not a batch id: {batch_id!r}")
    return "batch-" + batch_id.removeprefix("batch_")


def batch_id_from_name(name: str) -> str:
    """OpenAI id of a batch object: ``batch-<suffix>`` → ``batch_<suffix>``."""
    if not name.startswith("batch-"):
        raise ValueError(f"not a batch object name: {name!r}")
    return "batch_" + name.removeprefix("batch-")


def tenant_cache_salt(namespace: str) -> str:
    """The prefix-cache salt of a tenant's requests (vLLM ``cache_salt``): the same for every
    batch of the namespace, different across namespaces, so an engine shared by tenants never
    reuses one tenant's cached prefix for another's request. Derived, not secret: the executor
    replaces any salt a request line brings, so no tenant can send another's."""
    return "t-" + _digest("cache-salt", namespace)[:32]
