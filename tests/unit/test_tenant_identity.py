"""A tenant is a namespace by identity, not by name (``core.identity``): a deleted namespace's
keys stop working at once, and a new namespace of the same name inherits neither the old one's
keys nor its history — through the gateway app on the in-memory API (the real control plane:
tests/integration/test_tenancy.py)."""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity, key_acts_for, record_belongs
from llmbatch.gateway import metrics
from llmbatch.gateway.app import create_app
from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
from llmbatch.gateway.settings import GatewaySettings
from llmbatch.storage import FilesystemStore
from tests.fixtures.gateway import GATEWAY_NAMESPACE, FakeGateway, FakeKube, auth

NS = "team-i"


def status_of(gw: FakeGateway, key: str, path: str = "/v1/batches") -> int:
    return int(gw.client.get(path, headers=auth(key)).status_code)


def within(seconds: float, check: Callable[[], bool]) -> float:
    """How long ``check`` took to hold (at most ``seconds``, else the test fails)."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > seconds:
            raise AssertionError(f"not within {seconds} s")
        time.sleep(0.005)
    return time.monotonic() - began


def tenant_gone_failures() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "llmbatch_gateway_auth_failures_total", {"reason": "tenant_gone"}
    )
    return value or 0.0


def archived(store_root: pathlib.Path, n: int, tenant_uid: str | None) -> str:
    """A finished batch retention archived in ``NS`` (``tenant_uid`` None: a record written
    before records carried it); its id."""
    name = f"batch-{n:024x}"
    obj: dict[str, Any] = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"u-{n}",
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "spec": {"endpoint": "/v1/chat/completions", "completionWindow": "24h"},
        "status": {"status": "completed", "completedAt": 1},
    }
    record = archive.archive_record(obj, 1, tenant_uid or "")
    if tenant_uid is None:
        del record["tenantUID"]
    batch_id = name.replace("batch-", "batch_", 1)
    FilesystemStore(store_root).put(keys.archive_key(NS, batch_id), archive.encode(record))
    return batch_id


@contextlib.contextmanager
def serving(tmp_path: pathlib.Path, kube: FakeKube) -> Iterator[FakeGateway]:
    """The gateway app on ``kube`` and a filesystem store under ``tmp_path``."""
    from starlette.testclient import TestClient

    root = tmp_path / "store"
    settings = GatewaySettings(
        store_uri=f"file://{root}", gateway_namespace=GATEWAY_NAMESPACE, metrics_port=0
    )
    app = create_app(settings, kube=kube, store=FilesystemStore(root))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield FakeGateway(kube, root, client)


def listed_ids(gw: FakeGateway, key: str) -> list[str]:
    answer = gw.client.get("/v1/batches", headers=auth(key))
    assert answer.status_code == 200, answer.text
    return [b["id"] for b in answer.json()["data"]]


def test_a_deleted_namespaces_key_is_refused_at_once(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    assert status_of(fake_gateway, key) == 200
    before = tenant_gone_failures()
    fake_gateway.kube.delete_namespace(NS)
    within(1.0, lambda: status_of(fake_gateway, key) == 401)
    answer = fake_gateway.client.get("/v1/files", headers=auth(key))
    assert answer.json()["error"]["code"] == "invalid_api_key"
    assert tenant_gone_failures() - before >= 2


def test_a_namespace_being_deleted_refuses_its_keys(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key(NS)
    assert status_of(fake_gateway, key) == 200
    fake_gateway.kube.terminate_namespace(NS)
    within(1.0, lambda: status_of(fake_gateway, key) == 401)


def test_a_recreated_namespace_inherits_neither_keys_nor_history(tmp_path: pathlib.Path) -> None:
    kube = FakeKube()
    old_uid = kube.add_namespace(NS)
    bound = archived(tmp_path / "store", 1, old_uid)
    legacy = archived(tmp_path / "store", 2, None)  # created after the namespace: its own
    with serving(tmp_path, kube) as gw:
        old_key = gw.key(NS)  # made without a UID: bound to the namespace at first use
        assert sorted(listed_ids(gw, old_key)) == sorted([bound, legacy])
        assert status_of(gw, old_key, f"/v1/batches/{bound}") == 200

        time.sleep(1.1)  # the new namespace is created a second later than the old batches
        gw.kube.delete_namespace(NS)
        gw.kube.add_namespace(NS)  # same name, another tenant
        new_key = gw.key(NS)
        assert listed_ids(gw, new_key) == []
        for batch_id in (bound, legacy):
            assert status_of(gw, new_key, f"/v1/batches/{batch_id}") == 404
        assert status_of(gw, old_key) == 401  # bound at its first use: not the new one's

    with serving(tmp_path, kube) as gw:  # a restarted gateway reads the archive afresh
        assert listed_ids(gw, new_key) == []
        assert status_of(gw, old_key) != 200


def test_a_key_bound_to_an_earlier_namespace_of_the_name_is_refused(
    fake_gateway: FakeGateway,
) -> None:
    fake_gateway.key(NS)  # the namespace exists
    key = new_api_key()
    secret = key_secret(
        "key-of-the-old-one",
        hash_key(key),
        NS,
        ["inference:read"],
        GATEWAY_NAMESPACE,
        namespace_uid="uid-of-an-earlier-team-i",
    )
    fake_gateway.kube.put_secret(secret)
    time.sleep(0.2)  # the watch applies the Secret
    assert status_of(fake_gateway, key) == 401
    current = fake_gateway.kube.namespace_meta[NS]["uid"]
    fake_gateway.kube.put_secret({**secret, "stringData": {**secret["stringData"],
                                                           "namespaceUID": current}})  # fmt: skip
    within(1.0, lambda: status_of(fake_gateway, key) == 200)


@pytest.mark.parametrize(
    ("namespace", "bound", "acts"),
    [
        (None, None, False),  # no such namespace
        (NamespaceIdentity(NS, "u1", 10), None, True),  # an unbound key: bound at first use
        (NamespaceIdentity(NS, "u1", 10), "u1", True),
        (NamespaceIdentity(NS, "u2", 10), "u1", False),  # another namespace of the name
        (NamespaceIdentity(NS, "u1", 10, deleted_at=20), "u1", False),  # being deleted
    ],
)
def test_when_a_key_acts(
    namespace: NamespaceIdentity | None, bound: str | None, acts: bool
) -> None:
    assert key_acts_for(namespace, bound) is acts


def test_which_namespace_a_record_belongs_to() -> None:
    now = NamespaceIdentity(NS, "u2", created_at=1_800_000_000)
    made_before = {"metadata": {"creationTimestamp": "2027-01-15T07:59:59Z"}}
    made_after = {"metadata": {"creationTimestamp": "2027-01-15T08:00:00Z"}}
    assert not record_belongs(now, made_before)  # 1_799_999_999 < the namespace's creation
    assert record_belongs(now, made_after)
    assert record_belongs(now, {**made_before, "tenantUID": "u2"})  # the UID decides
    assert not record_belongs(now, {**made_after, "tenantUID": "u1"})
    assert not record_belongs(now, {"metadata": {}})
