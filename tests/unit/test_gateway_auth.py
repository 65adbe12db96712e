"""API keys: format, hashing, Secrets, the key ring and scopes."""

from __future__ import annotations

import base64
import hashlib
import re

from llmbatch.gateway.auth import (
    KeyRing,
    Principal,
    hash_key,
    is_key_secret,
    key_secret,
    new_api_key,
    parse_scopes,
    principal_of_secret,
)


def _as_stored(secret: dict) -> dict:  # type: ignore[type-arg]
    """What the API server returns: stringData folded into base64 data."""
    out = dict(secret)
    out["data"] = {
        k: base64.b64encode(v.encode()).decode() for k, v in out.pop("stringData").items()
    }
    return out


def test_new_key_format_and_hash() -> None:
    key = new_api_key()
    assert re.fullmatch(r"sk-llmb-[A-Za-z0-9_-]{43}", key)
    assert new_api_key() != key
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()


def test_secret_holds_only_the_hash() -> None:
    key = new_api_key()
    secret = key_secret("k1", hash_key(key), "team-a", ["inference:read"], "gw")
    assert secret["metadata"]["labels"]["llmbatch.io/api-key"] == "true"
    assert secret["metadata"]["namespace"] == "gw"
    assert key not in str(secret)
    digest, principal = principal_of_secret(_as_stored(secret)) or ("", None)
    assert digest == hash_key(key)
    assert principal == Principal("team-a", frozenset({"inference:read"}), "k1")


def test_malformed_secrets_are_ignored() -> None:
    good = key_secret("k", hash_key("x"), "team-a", ["inference:write"], "gw")
    assert principal_of_secret(_as_stored({**good, "stringData": {"sha256": "nothex"}})) is None
    bad_ns = {**good, "stringData": {**good["stringData"], "namespace": "Not_A_Namespace"}}
    assert principal_of_secret(_as_stored(bad_ns)) is None
    assert principal_of_secret({"metadata": {"name": "x"}, "data": {"sha256": "!!"}}) is None


def test_scopes() -> None:
    assert parse_scopes("inference:write, inference:read,admin") == {
        "inference:write",
        "inference:read",
    }
    read_only = Principal("ns", parse_scopes("inference:read"), "k")
    assert read_only.can_read()
    assert not read_only.can_write()
    write = Principal("ns", parse_scopes("inference:write"), "k")
    assert write.can_write()
    assert write.can_read()
    none = Principal("ns", parse_scopes(""), "k")
    assert not none.can_read()
    assert not none.can_write()


def test_keyring_replace_apply_and_revoke() -> None:
    ring = KeyRing()
    assert not ring.loaded
    k1, k2 = new_api_key(), new_api_key()
    s1 = _as_stored(key_secret("s1", hash_key(k1), "team-a", ["inference:write"], "gw"))
    s2 = _as_stored(key_secret("s2", hash_key(k2), "team-b", ["inference:read"], "gw"))
    ring.replace([s1])
    assert ring.loaded
    assert len(ring) == 1
    who = ring.authenticate(k1)
    assert who is not None
    assert who.namespace == "team-a"
    assert ring.authenticate(k2) is None
    ring.apply("ADDED", s2)
    who2 = ring.authenticate(k2)
    assert who2 is not None
    assert who2.namespace == "team-b"
    ring.apply("DELETED", s1)
    assert ring.authenticate(k1) is None
    assert ring.authenticate("") is None
    assert ring.authenticate(k2 + "x") is None
    # a modified secret that becomes malformed stops authenticating
    ring.apply("MODIFIED", {**s2, "data": {"sha256": base64.b64encode(b"zz").decode()}})
    assert ring.authenticate(k2) is None


def test_a_key_secret_carries_its_namespaces_uid() -> None:
    secret = key_secret("k", hash_key("x"), "team-a", ["inference:read"], "gw", "uid-1")
    assert secret["stringData"]["namespaceUID"] == "uid-1"
    _, principal = principal_of_secret(_as_stored(secret)) or ("", None)
    assert principal is not None
    assert principal.namespace_uid == "uid-1"
    unbound = key_secret("k", hash_key("x"), "team-a", ["inference:read"], "gw")
    assert "namespaceUID" not in unbound["stringData"]  # made before keys were bound
    bad = {**secret, "stringData": {**secret["stringData"], "namespaceUID": "../x"}}
    assert principal_of_secret(_as_stored(bad)) is None


def test_only_an_api_keys_secret_counts_as_one() -> None:
    """What ``llmbatch keys revoke`` deletes: nothing but a labelled Secret holding a key."""
    good = _as_stored(key_secret("k", hash_key("x"), "team-a", ["inference:read"], "gw"))
    assert is_key_secret(good)
    unlabelled = {**good, "metadata": {**good["metadata"], "labels": {}}}
    assert not is_key_secret(unlabelled)  # the same data without the label
    tls = {
        "metadata": {"name": "k", "labels": {"llmbatch.io/api-key": "true"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": "eA==", "tls.key": "eA=="},
    }
    assert not is_key_secret(tls)  # labelled, but no key in it
