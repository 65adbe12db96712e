"""Private deployments belong to tenants (a pool's ``tenants``) and pools may refuse expedited
work: the pure rules (llmbatch.core.tenancy, core.admission) and the gateway on an in-memory
Kubernetes (create answers 404 / 400 and stores nothing, /v1/models hides others' pools)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from llmbatch.api.resources import BatchPoolSpec, NamespaceSelector, PoolTenants
from llmbatch.core import admission
from llmbatch.core.tenancy import Tenant, selects, serves
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.gateway import FakeGateway, auth
from tests.fixtures.reconciler import ReconcilerHarness
from tests.unit.test_gateway_admission import add_account, create, jsonl, rows, upload

NS = "team-a"


def pool(name: str, model: str = "llama", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"models": [{"name": model, "source": "/m"}], **spec},
        "status": {},
    }


PRIVATE = {"billing": {"mode": "GPUTime", "gpuHourPrice": "2"}, "tenants": {"namespaces": [NS]}}


def selector(**raw: Any) -> NamespaceSelector:
    return NamespaceSelector.model_validate(raw)


@pytest.mark.parametrize(
    ("raw", "labels", "expected"),
    [
        ({}, {}, True),
        ({"matchLabels": {"org": "a"}}, {"org": "a"}, True),
        ({"matchLabels": {"org": "a"}}, {"org": "b"}, False),
        ({"matchLabels": {"org": "a"}}, {}, False),
        (
            {"matchExpressions": [{"key": "org", "operator": "In", "values": ["a", "b"]}]},
            {"org": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "org", "operator": "In", "values": ["a"]}]}, {}, False),
        ({"matchExpressions": [{"key": "org", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        (
            {"matchExpressions": [{"key": "org", "operator": "NotIn", "values": ["a"]}]},
            {"org": "a"},
            False,
        ),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": ""}, True),
        ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {"gpu": "x"}, False),
    ],
)
def test_a_namespace_selector_evaluates_like_kubernetes(
    raw: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    assert selects(selector(**raw), labels) is expected


def test_a_pool_serves_its_listed_or_selected_tenants_and_unset_means_everyone() -> None:
    a, b = Tenant("team-a", {"org": "x"}), Tenant("team-b")
    assert serves(None, a)
    assert serves(None, b)
    listed = PoolTenants(namespaces=["team-a"])
    assert serves(listed, a)
    assert not serves(listed, b)
    by_label = PoolTenants.model_validate({"namespaceSelector": {"matchLabels": {"org": "x"}}})
    assert serves(by_label, a)
    assert not serves(by_label, b)
    assert not serves(PoolTenants(), a)  # tenants set, naming nobody: serves nobody


def test_choose_pool_skips_pools_that_do_not_serve_the_tenant() -> None:
    private = pool("a-private", **PRIVATE)
    shared = pool("b-shared")
    pools = [private, shared]
    assert admission.choose_pool(pools, "llama", tenant=Tenant(NS)) is private
    assert admission.choose_pool(pools, "llama", tenant=Tenant("team-b")) is shared
    assert admission.choose_pool([private], "llama", tenant=Tenant("team-b")) is None
    broken = pool("c", tenants={"namespaces": "not-a-list"})
    assert admission.choose_pool([broken], "llama", tenant=Tenant(NS)) is None  # fail closed


def test_check_tier_refuses_expedited_on_a_pool_that_disallows_it() -> None:
    spec = BatchPoolSpec.model_validate({"models": [{"name": "m", "source": "/m"}]})
    assert admission.check_tier("p", spec, "expedited") is None
    closed = spec.model_copy(update={"expedited_allowed": False})
    refusal = admission.check_tier("p", closed, "expedited")
    assert refusal is not None
    assert (refusal.kind, refusal.code, refusal.param) == (
        "not_allowed",
        "expedited_not_allowed",
        "priority",
    )
    assert admission.check_tier("p", closed, "standard") is None


# --- the gateway ---------------------------------------------------------------------------------


def stored_keys(gw: FakeGateway) -> list[str]:
    return sorted(str(p.relative_to(gw.store_root)) for p in gw.store_root.rglob("*"))


def batch_objects(gw: FakeGateway) -> list[Any]:
    return [k for k in gw.kube.objects if k[0] == "batches"]


def test_another_tenants_deployment_is_404_at_create_and_not_listed(
    fake_gateway: FakeGateway,
) -> None:
    fake_gateway.kube.pools.append(pool("private-a", **PRIVATE))
    mine, theirs = fake_gateway.key(NS), fake_gateway.key("team-b")
    # the owner sees its deployment, billed by GPU time, owned by its organization
    listed = fake_gateway.client.get("/v1/models", headers=auth(mine)).json()["data"]
    assert [(m["id"], m["owned_by"], m["batch"]["kind"]) for m in listed] == [
        ("llama", NS, "deployment")
    ]
    assert listed[0]["batch"]["gpu_hour_price"] == "2"
    # another tenant neither lists nor retrieves it
    assert fake_gateway.client.get("/v1/models", headers=auth(theirs)).json()["data"] == []
    resp = fake_gateway.client.get("/v1/models/llama", headers=auth(theirs))
    assert resp.status_code == 404
    # an upload (validated line by line) is a file; the batch made of it is 400 model_not_found
    file_id = upload(fake_gateway, theirs, jsonl(rows(2)))
    before = stored_keys(fake_gateway)
    resp = create(fake_gateway, theirs, file_id)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"
    assert resp.json()["error"]["param"] == "input_file_id"
    # inline: the same, naming the request; nothing is staged, no Batch created
    resp = create(fake_gateway, theirs, requests=rows(2))
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "model_not_found"
    assert resp.json()["error"]["param"] == "requests[0].body.model"
    assert stored_keys(fake_gateway) == before
    assert batch_objects(fake_gateway) == []
    # the owner's batch is accepted
    assert create(fake_gateway, mine, requests=rows(2)).status_code == 200


def test_another_tenants_model_answers_exactly_as_a_model_nobody_serves(
    fake_gateway: FakeGateway,
) -> None:
    """Nothing tells a private model's name from an unknown one: same status, code, message
    shape and param."""
    fake_gateway.kube.pools.append(pool("private-a", **PRIVATE))
    theirs = fake_gateway.key("team-b")
    hidden = create(fake_gateway, theirs, requests=rows(1)).json()["error"]
    unknown = create(fake_gateway, theirs, requests=rows(1, model="nobody")).json()["error"]
    assert hidden == {**unknown, "message": unknown["message"].replace("nobody", "llama")}
    assert hidden["code"] == "model_not_found"


def test_a_label_selected_tenant_is_served_and_others_are_not(fake_gateway: FakeGateway) -> None:
    tenants = {"namespaceSelector": {"matchLabels": {"llmbatch.io/org": "acme"}}}
    fake_gateway.kube.pools.append(pool("private-acme", tenants=tenants))
    fake_gateway.kube.namespace_label_values[NS] = {"llmbatch.io/org": "acme"}
    mine, theirs = fake_gateway.key(NS), fake_gateway.key("team-b")
    assert [
        m["id"] for m in fake_gateway.client.get("/v1/models", headers=auth(mine)).json()["data"]
    ] == ["llama"]
    assert fake_gateway.client.get("/v1/models", headers=auth(theirs)).json()["data"] == []
    assert create(fake_gateway, theirs, requests=rows(1)).status_code == 400
    assert create(fake_gateway, mine, requests=rows(1)).status_code == 200


def test_a_catalog_model_is_listed_as_catalog(fake_gateway: FakeGateway) -> None:
    fake_gateway.kube.pools.append(pool("shared"))
    fake_gateway.kube.pools.append(pool("shared-gpu", model="gpu", billing=PRIVATE["billing"]))
    listed = fake_gateway.client.get("/v1/models", headers=auth(fake_gateway.key(NS))).json()
    entries = {m["id"]: m for m in listed["data"]}
    entry = entries["llama"]
    assert (entry["owned_by"], entry["batch"]["kind"]) == ("llmbatch", "catalog")
    assert "gpu_hour_price" not in entry["batch"]
    # a GPUTime pool serving everyone is billed as a deployment but is nobody's own
    gpu = entries["gpu"]
    assert (gpu["owned_by"], gpu["batch"]["kind"]) == ("llmbatch", "deployment")


def test_expedited_on_a_pool_that_disallows_it_is_400_priority_nothing_stored(
    fake_gateway: FakeGateway,
) -> None:
    fake_gateway.kube.pools.append(pool("no-expedited", expeditedAllowed=False))
    key = fake_gateway.key(NS)
    add_account(fake_gateway, "100")
    before = stored_keys(fake_gateway)
    resp = create(fake_gateway, key, requests=rows(2), priority="expedited")
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["param"]) == ("expedited_not_allowed", "priority")
    assert stored_keys(fake_gateway) == before
    assert batch_objects(fake_gateway) == []
    status = fake_gateway.kube.objects[("creditaccounts", NS, "default")].get("status") or {}
    assert not status.get("reservations")  # nothing held
    assert create(fake_gateway, key, requests=rows(2)).status_code == 200


# --- the operator (defence in depth) ------------------------------------------------------------

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"


def test_the_operator_refuses_a_batch_for_another_tenants_deployment(
    tmp_path: pathlib.Path,
) -> None:
    """A Batch applied with kubectl (no gateway) for a pool that does not serve its namespace
    fails with model_not_found, the same message as for a model no pool serves: the other
    tenant's models are not listed."""
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool("private-b", models=("m",), tenants={"namespaces": ["b"]}))
    h.kube.add("batchpools", make_pool("shared", models=("other",)))
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 2))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    status = h.step_until(BATCH, "failed")
    (error,) = status["errors"]
    assert error["code"] == "model_not_found"
    assert error["message"] == "Model 'm' is not served by any pool. Served models: other."


def test_the_operator_serves_a_tenant_its_selector_matches(tmp_path: pathlib.Path) -> None:
    h = ReconcilerHarness(tmp_path)
    selector = {"namespaceSelector": {"matchLabels": {"org": "acme"}}}
    h.kube.add("batchpools", make_pool("private-acme", tenants=selector))
    h.kube.namespaces[TENANT] = {}
    h.kube.namespace_label_values[TENANT] = {"org": "acme"}
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 2))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    status = h.step_until(BATCH, "in_progress")
    assert status["pool"] == "private-acme"


def test_the_operator_refuses_expedited_on_a_pool_that_disallows_it(
    tmp_path: pathlib.Path,
) -> None:
    h = ReconcilerHarness(tmp_path)
    h.kube.add("batchpools", make_pool(expeditedAllowed=False))
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 2))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE, priority="expedited"))
    (error,) = h.step_until(BATCH, "failed")["errors"]
    assert (error["code"], error["param"]) == ("expedited_not_allowed", "priority")
