"""Private deployments belong to tenants, expedited is refused where a pool disallows it, and
tier prices that break the documents' order are flagged — on the real control plane, through
the official openai SDK against a gateway process, and with a real operator for what a kubectl
Batch meets (#32 items 5, 7, 8). A tenant is its namespace by identity: a deleted namespace's
keys stop at once and its data is erased after the grace period, a new namespace of the same
name inherits nothing, and ``llmbatch keys revoke`` deletes only API keys (#55)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import yaml

from llmbatch.core import archive, keys
from llmbatch.storage import FilesystemStore
from tests.fixtures.gateway import (
    GatewayProcess,
    Tenant,
    gateway_on_operator_store,
    wait_for_key,
)
from tests.fixtures.operator import TENANT_GRACE_SECONDS, OperatorProcess, simulated_pool
from tests.integration.test_gateway import CHAT, TenantFactory, create, jsonl, line, upload

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def pools(gateway_process: GatewayProcess) -> Iterator[list[str]]:
    """Names of the pools a test applies (deleted after it)."""
    made: list[str] = []
    yield made
    for name in made:
        gateway_process.kubectl("delete", "batchpool", name, "--wait=false", check=False)


def apply_pool(gw: GatewayProcess, made: list[str], model: str, **spec: Any) -> str:
    name = f"pool-{uuid.uuid4().hex[:6]}"
    manifest = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "BatchPool",
        "metadata": {"name": name},
        "spec": {"models": [{"name": model, "source": "/models/x"}], **spec},
    }
    gw.kubectl("apply", "-f", "-", obj=manifest)
    made.append(name)
    return name


def inline(client: openai.OpenAI, rows: list[dict[str, Any]], **extra: Any) -> Any:
    body = {"endpoint": CHAT, "completion_window": "24h", "requests": rows, **extra}
    return client.post("/batches", body=body, cast_to=openai.types.Batch)


def model_ids(tenant: Tenant) -> set[str]:
    return {m.id for m in tenant.client().models.list().data}


def test_a_private_deployment_is_its_tenants_only(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess, pools: list[str]
) -> None:
    owner, other = tenant_factory(), tenant_factory()
    model = f"private-{uuid.uuid4().hex[:6]}"
    tenants = {"namespaces": [owner.namespace]}
    billing = {"mode": "GPUTime", "gpuHourPrice": "2.40"}
    apply_pool(gateway_process, pools, model, tenants=tenants, billing=billing)
    # the owner sees its deployment, marked as such, and its batches are accepted
    entry = owner.client().models.retrieve(model).model_dump()
    assert (entry["owned_by"], entry["batch"]["kind"]) == (owner.namespace, "deployment")
    assert entry["batch"]["gpu_hour_price"] == "2.40"
    rows = [line(1, model=model), line(2, model=model)]
    assert create(owner.client(), upload(owner.client(), jsonl(rows))).status == "validating"
    # another tenant does not see it (404), and its batches for it are 400 model_not_found
    client = other.client()
    assert model not in model_ids(other)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(model)
    file_id = upload(client, jsonl(rows))  # the upload is checked line by line, and kept
    with pytest.raises(openai.BadRequestError) as err:
        create(client, file_id)
    assert (err.value.code, err.value.param) == ("model_not_found", "input_file_id")
    with pytest.raises(openai.BadRequestError) as err:
        inline(client, rows)
    assert (err.value.code, err.value.param) == ("model_not_found", "requests[0].body.model")
    assert client.batches.list().data == []  # nothing created


def test_a_label_selector_names_the_served_tenants(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess, pools: list[str]
) -> None:
    member, outsider = tenant_factory(), tenant_factory()
    org = f"org-{uuid.uuid4().hex[:6]}"
    gateway_process.kubectl("label", "namespace", member.namespace, f"llmbatch.io/org={org}")
    model = f"selected-{uuid.uuid4().hex[:6]}"
    selector = {"namespaceSelector": {"matchLabels": {"llmbatch.io/org": org}}}
    apply_pool(gateway_process, pools, model, tenants=selector)
    assert model in model_ids(member)
    entry = member.client().models.retrieve(model).model_dump()
    assert (entry["owned_by"], entry["batch"]["kind"]) == ("llmbatch", "catalog")
    assert model not in model_ids(outsider)
    assert inline(member.client(), [line(1, model=model)]).status == "validating"
    with pytest.raises(openai.BadRequestError):
        inline(outsider.client(), [line(1, model=model)])


def test_expedited_on_a_pool_that_disallows_it_is_400_at_create(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess, pools: list[str]
) -> None:
    tenant = tenant_factory()
    model = f"noexp-{uuid.uuid4().hex[:6]}"
    apply_pool(gateway_process, pools, model, expeditedAllowed=False)
    client = tenant.client()
    file_id = upload(client, jsonl([line(1, model=model)]))
    with pytest.raises(openai.BadRequestError) as err:
        create(client, file_id, extra_body={"priority": "expedited"})
    assert (err.value.code, err.value.param) == ("expedited_not_allowed", "priority")
    with pytest.raises(openai.BadRequestError) as err:
        inline(client, [line(1, model=model)], priority="expedited")
    assert (err.value.code, err.value.param) == ("expedited_not_allowed", "priority")
    assert client.batches.list().data == []  # nothing stored
    assert create(client, file_id).priority == "standard"  # the standard tier is served


# --- the operator --------------------------------------------------------------------------------


def kubectl_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def apply(cluster: Any, tmp_path: pathlib.Path, obj: dict[str, Any]) -> None:
    path = tmp_path / f"{uuid.uuid4().hex}.json"
    path.write_text(json.dumps(obj))
    cluster.kubectl("apply", "-f", str(path))


def wait(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_operator_refuses_a_kubectl_batch_for_another_tenants_pool(
    cluster: Any, namespace: str, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    model = f"sim-{uuid.uuid4().hex[:6]}"
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    apply(cluster, tmp_path, simulated_pool(pool, model, tenants={"namespaces": ["someone-else"]}))
    try:
        name = f"batch-{uuid.uuid4().hex[:24]}"
        request = {
            "customID": "r1",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            },
        }
        batch = {
            "apiVersion": "llmbatch.io/v1alpha1",
            "kind": "Batch",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"endpoint": CHAT, "completionWindow": "24h", "requests": [request]},
        }
        apply(cluster, tmp_path, batch)

        def failed() -> Any:
            status = kubectl_json(cluster, "get", "batch", name, "-n", namespace).get("status")
            return status if (status or {}).get("status") == "failed" else None

        status = wait(f"{name} failed", failed)
        (error,) = status["errors"]
        assert error["code"] == "model_not_found"
        assert model in error["message"]
        assert status.get("pool") is None  # never placed on the other tenant's pool
    finally:
        cluster.kubectl("delete", "batchpool", pool, "--wait=false", check=False)


def test_a_pool_whose_prices_break_the_order_is_flagged(
    cluster: Any, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    cheap = {"inputPerMillion": "0.10", "outputPerMillion": "0.10"}
    dear = {"inputPerMillion": "0.22", "outputPerMillion": "0.22"}
    tiers = {
        "expedited": {"drainTargetSeconds": 600, "pricing": cheap},
        "standard": {"drainTargetSeconds": 43200, "pricing": dear},
        "flex": {"drainTargetSeconds": 172800, "pricing": cheap},
    }
    manifest = simulated_pool(pool, f"sim-{uuid.uuid4().hex[:6]}", tiers=tiers)
    apply(cluster, tmp_path, manifest)
    try:

        def condition(status: str) -> Any:
            def check() -> Any:
                obj = kubectl_json(cluster, "get", "batchpool", pool)
                for cond in (obj.get("status") or {}).get("conditions") or []:
                    if cond["type"] == "TierPricesOrdered" and cond["status"] == status:
                        return cond
                return None

            return check

        cond = wait("TierPricesOrdered=False", condition("False"))
        assert cond["reason"] == "TierPricesOutOfOrder"
        assert (
            "tiers.expedited inputPerMillion 0.10 is below tiers.standard's 0.22"
            in (cond["message"])
        )
        time.sleep(3)  # several pool rounds: the warning is posted once, not every round
        events = kubectl_json(
            cluster, "get", "events", "-A", "--field-selector", f"involvedObject.name={pool}"
        )["items"]
        warnings = [e for e in events if e["reason"] == "TierPricesOutOfOrder"]
        assert [(e["type"], e.get("count") or 1) for e in warnings] == [("Warning", 1)]
        # fixed: the condition clears
        manifest["spec"]["tiers"]["expedited"]["pricing"] = {
            "inputPerMillion": "0.44",
            "outputPerMillion": "0.44",
        }
        apply(cluster, tmp_path, manifest)
        wait("TierPricesOrdered=True", condition("True"))
    finally:
        cluster.kubectl("delete", "batchpool", pool, "--wait=false", check=False)


# --- tenants by identity: a namespace's name is reused, its UID is not -------------------------


def namespace_uid(cluster: Any, namespace: str) -> str:
    return str(kubectl_json(cluster, "get", "namespace", namespace)["metadata"]["uid"])


def store_keys(root: pathlib.Path, namespace: str) -> list[str]:
    """What the store holds of ``namespace`` in the areas offboarding erases."""
    found: list[str] = []
    for area in keys.TENANT_AREAS:
        found += [
            str(p) for p in (root / keys.tenant_area(area, namespace)).rglob("*") if p.is_file()
        ]
    return found


def archived_record(root: pathlib.Path, namespace: str, tenant_uid: str | None) -> str:
    """A finished batch as retention archives it (``tenant_uid`` None: a record written before
    records carried one), written into the operator's store; its id."""
    suffix = uuid.uuid4().hex[:24]
    obj = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "Batch",
        "metadata": {
            "name": f"batch-{suffix}",
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "spec": {"endpoint": CHAT, "completionWindow": "24h"},
        "status": {"status": "completed", "completedAt": int(time.time())},
    }
    record = archive.archive_record(obj, int(time.time()), tenant_uid or "")
    if tenant_uid is None:
        del record["tenantUID"]
    FilesystemStore(root).put(
        keys.archive_key(namespace, f"batch_{suffix}"), archive.encode(record)
    )
    return f"batch_{suffix}"


def refused(client: openai.OpenAI) -> bool:
    try:
        client.batches.list()
    except openai.AuthenticationError:
        return True
    return False


def test_a_deleted_namespaces_key_is_refused_at_once_and_its_data_erased_after_the_grace(
    cluster: Any,
    operator_process: OperatorProcess,
    gateway: GatewayProcess,
    tenant: tuple[str, openai.OpenAI],
) -> None:
    namespace, client = tenant
    root = operator_process.store_root
    uploaded = upload(client, jsonl([line(1)]))
    archived_record(root, namespace, namespace_uid(cluster, namespace))
    work = root / keys.shard_spec_key(namespace, str(uuid.uuid4()), 0)  # a work area left over
    work.parent.mkdir(parents=True, exist_ok=True)
    work.write_text("{}")
    assert client.files.retrieve(uploaded).id == uploaded
    uid = namespace_uid(cluster, namespace)
    wait("the operator notes the tenant", lambda: (root / keys.tenant_key(namespace, uid)).exists())
    sweeps_before = metric(operator_process.metrics(), "llmbatch_tenant_sweeps_total")

    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    deleted_at = time.monotonic()
    wait("the key refused", lambda: refused(client), timeout=5)
    took = time.monotonic() - deleted_at
    assert took < 2.0, f"the key still worked {took:.2f} s after the deletion"

    assert store_keys(root, namespace)  # kept for the grace period
    wait("the namespace gone", lambda: not namespace_exists(cluster, namespace), timeout=120)
    wait(
        "the tenant's data erased",
        lambda: (
            not store_keys(root, namespace) and not list((root / "tenants").glob(f"{namespace}/*"))
        ),
        timeout=TENANT_GRACE_SECONDS + 60,
    )
    assert metric(operator_process.metrics(), "llmbatch_tenant_sweeps_total") > sweeps_before


def namespace_exists(cluster: Any, namespace: str) -> bool:
    found = cluster.kubectl("get", "namespace", namespace, "--ignore-not-found", "-o", "name")
    return bool(found.strip())


def metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def keys_cli(
    gw: GatewayProcess, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    common = ["--gateway-namespace", gw.gateway_namespace, "--kubeconfig", gw.kubeconfig]
    return subprocess.run(
        [sys.executable, "-m", "llmbatch", "keys", *args, *common],
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
    )


def test_a_recreated_namespace_sees_none_of_the_old_tenants_history(
    cluster: Any, operator_process: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    namespace = f"reborn-{uuid.uuid4().hex[:8]}"
    root = operator_process.store_root
    cluster.kubectl("create", "namespace", namespace)
    first = namespace_uid(cluster, namespace)
    history = [archived_record(root, namespace, first), archived_record(root, namespace, None)]
    with gateway_on_operator_store(
        str(cluster.kubeconfig), root, tmp_path, f"llmbatch-reborn-{uuid.uuid4().hex[:6]}"
    ) as gw:
        old_key = keys_cli(gw, "create", "--namespace", namespace).stdout.strip()
        assert first in keys_cli(gw, "list").stdout  # bound to the namespace's UID
        wait_for_key(gw.base_url, old_key, accepted=True)
        old = openai.OpenAI(base_url=gw.base_url + "/v1", api_key=old_key, max_retries=0)
        assert sorted(b.id for b in old.batches.list().data) == sorted(history)
        uploaded = upload(old, jsonl([line(1)]))

        cluster.kubectl("delete", "namespace", namespace, "--timeout=120s")
        time.sleep(1.1)  # the new namespace is created a second after the old batches were
        cluster.kubectl("create", "namespace", namespace)
        assert namespace_uid(cluster, namespace) != first
        new_key = keys_cli(gw, "create", "--namespace", namespace).stdout.strip()
        wait_for_key(gw.base_url, new_key, accepted=True)
        new = openai.OpenAI(base_url=gw.base_url + "/v1", api_key=new_key, max_retries=0)
        assert new.batches.list().data == []
        assert new.files.list().data == []
        for batch_id in history:
            with pytest.raises(openai.NotFoundError):
                new.batches.retrieve(batch_id)
        with pytest.raises(openai.NotFoundError):
            new.files.retrieve(uploaded)
        assert refused(old)  # the old key is the old namespace's, not the new one's
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_keys_revoke_deletes_only_an_api_keys_secret(
    tenant_factory: TenantFactory, gateway_process: GatewayProcess
) -> None:
    gw_ns = gateway_process.gateway_namespace
    plain = f"not-a-key-{uuid.uuid4().hex[:6]}"
    gateway_process.kubectl("create", "secret", "generic", plain, "-n", gw_ns, "--from-literal=a=b")
    labelled = f"labelled-{uuid.uuid4().hex[:6]}"
    gateway_process.kubectl(
        "apply", "-f", "-",
        obj={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": labelled, "namespace": gw_ns,
                         "labels": {"llmbatch.io/api-key": "true"}},
            "stringData": {"password": "hunter2"},
        },
    )  # fmt: skip
    try:
        for name in (plain, labelled):
            done = keys_cli(gateway_process, "revoke", name, check=False)
            assert done.returncode != 0
            assert "is not an llmbatch API key" in done.stderr
            assert name in gateway_process.kubectl("get", "secret", name, "-n", gw_ns, "-o", "name")
        missing = keys_cli(gateway_process, "revoke", f"gone-{uuid.uuid4().hex[:6]}", check=False)
        assert missing.returncode != 0
        assert "no key" in missing.stderr
        tenant = tenant_factory()
        keys_cli(gateway_process, "revoke", tenant.secret_name)
        wait_for_key(gateway_process.base_url, tenant.key, accepted=False, timeout=10)
    finally:
        for name in (plain, labelled):
            gateway_process.kubectl("delete", "secret", name, "-n", gw_ns, check=False)


def test_the_documented_tenant_role_shows_a_tenant_no_pool(
    cluster: Any, operator_process: OperatorProcess
) -> None:
    """docs/security.md's tenant role, applied as written (the operator's fixture applied the
    CRDs): a tenant creates batches in its own namespace and sees no BatchPool (a list would
    show every tenant's private models and the pools' per-tenant usage; /v1/models shows it the
    pools that serve it)."""
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    manifest = page.split("# tenant-rbac.yaml\n", 1)[1].split("```", 1)[0]
    (role,) = [doc for doc in yaml.safe_load_all(manifest) if doc["kind"] == "ClusterRole"]
    # Pools are cluster-scoped: a pool rule takes effect only bound cluster-wide, and then
    # shows every pool. The role names none.
    assert not [r for r in role["rules"] if "batchpools" in r["resources"]]
    namespace = f"role-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", namespace)
    path = pathlib.Path(cluster.kubeconfig).parent / f"{namespace}-rbac.yaml"
    path.write_text(manifest.replace("namespace: team-a", f"namespace: {namespace}"))
    try:
        cluster.kubectl("apply", "-f", str(path))

        def can(*args: str) -> str:
            answer = cluster.kubectl(
                "auth", "can-i", *args, "--as=dev", "--as-group=team-a-developers", check=False
            )
            return str(answer).strip().splitlines()[0]

        assert can("create", "batches.llmbatch.io", "-n", namespace) == "yes"
        assert can("list", "batchfiles.llmbatch.io", "-n", namespace) == "yes"
        assert can("create", "batches.llmbatch.io", "-n", "default") == "no"
        assert can("list", "batchpools.llmbatch.io") == "no"
        assert can("get", "batchpools.llmbatch.io") == "no"
    finally:
        cluster.kubectl("delete", "-f", str(path), "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
