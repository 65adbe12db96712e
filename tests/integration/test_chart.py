"""The Helm chart, rendered by the pinned helm: lint, templates over several value sets, the strict
values schema, secure pod defaults and the golden RBAC rules."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import yaml

from tests.fixtures.chart import (
    CHART,
    CLUSTER,
    GOLDEN_RBAC,
    ROOT,
    VALUE_SETS,
    dump_grants,
    granted,
    helm,
    load_golden,
    render,
)

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate"}


def pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{o['kind']}/{o['metadata']['name']}", o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] in WORKLOADS
    ]


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_lint_and_template(values: pathlib.Path) -> None:
    helm("lint", "--strict", str(CHART), "-f", str(values))
    objects = render(values)
    kinds = {o["kind"] for o in objects}
    assert "Deployment" in kinds
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", obj["kind"]


def test_default_install_has_every_part() -> None:
    objects = render()
    by_kind: dict[str, list[str]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj["metadata"]["name"])
    assert {f"{n}.yaml" for n in by_kind["CustomResourceDefinition"]} == {
        p.name for p in (ROOT / "crds").glob("*.yaml")
    }
    assert sorted(by_kind["PriorityClass"]) == [
        "llmbatch-expedited",
        "llmbatch-flex",
        "llmbatch-standard",
    ]
    assert by_kind["Namespace"] == ["llmbatch-workers"]
    assert sorted(by_kind["Deployment"]) == ["llmbatch-gateway", "llmbatch-operator"]
    operator = next(
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "llmbatch-operator"
    )
    assert operator["spec"]["replicas"] == 1
    assert operator["spec"]["strategy"] == {"type": "Recreate"}
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["LLMBATCH_PRIORITY_CLASS_PREFIX"] == "llmbatch"
    assert {p["name"] for p in container["ports"]} == {"metrics", "health"}
    workers = next(o for o in objects if o["kind"] == "Namespace")
    assert workers["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert sorted(by_kind["Service"]) == [
        "llmbatch-gateway",
        "llmbatch-gateway-metrics",
        "llmbatch-operator-metrics",
    ]
    assert by_kind["PodDisruptionBudget"] == ["llmbatch-gateway"]
    assert sorted(by_kind["NetworkPolicy"]) == [
        "llmbatch-executors",
        "llmbatch-gateway",
        "llmbatch-operator",
    ]


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    container: dict[str, Any] = _find(objects, "Deployment", deployment)["spec"]["template"][
        "spec"
    ]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("store.uri=s3://b/p",), "image.registry is required: build and push the images first"),
        (("image.registry=r.example.com/x",), "store.uri is required"),
        (
            (
                "image.registry=r",
                "store.uri=s3://b",
                "gateway.ingress.enabled=true",
                "gateway.ingress.host=h.example.com",
                "gateway.ingress.tls.issuerRef.name=le",
            ),
            "does not serve cert-manager.io/v1 Certificates",
        ),
        (
            ("image.registry=r", "store.uri=s3://b", "gateway.metricsPort=8080"),
            "gateway.port and gateway.metricsPort must differ",
        ),
    ],
)
def test_required_values_fail_with_a_clear_message(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_store_credentials_reach_every_component_as_environment() -> None:
    objects = render(sets=("store.secretName=llmbatch-store",))
    for deployment in ("llmbatch-operator", "llmbatch-gateway"):
        container = _container(objects, deployment)
        assert container["envFrom"] == [{"secretRef": {"name": "llmbatch-store"}}], deployment
        assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}], deployment
    env = {e["name"]: e.get("value") for e in _container(objects, "llmbatch-operator")["env"]}
    # Executor pods get the Secret of the same name in their worker namespace (jobs.py).
    assert env["LLMBATCH_EXECUTOR_STORE_SECRET"] == "llmbatch-store"
    assert env["LLMBATCH_STORE_URI"] == env["LLMBATCH_EXECUTOR_STORE_URI"]
    plain = {e["name"] for e in _container(render(), "llmbatch-operator")["env"]}
    assert "LLMBATCH_EXECUTOR_STORE_SECRET" not in plain
    assert "envFrom" not in _container(render(), "llmbatch-gateway")


@pytest.mark.parametrize(
    ("sets", "params"),
    [
        (("store.encryption.mode=sse-s3",), {"sse": "AES256"}),
        (
            ("store.encryption.mode=sse-kms", "store.encryption.kmsKeyID=arn:aws:kms:r:1:key/k"),
            {"sse": "aws:kms", "sse_kms_key_id": "arn:aws:kms:r:1:key/k"},
        ),
    ],
)
def test_store_encryption_reaches_every_component_through_the_store_uris(
    sets: tuple[str, ...], params: dict[str, str]
) -> None:
    """The operator, the gateway and (through LLMBATCH_EXECUTOR_STORE_URI) every executor pod
    open the store with the same sse parameters; the URIs still parse."""
    from llmbatch.storage import parse_store_uri

    objects = render(sets=(*sets, "store.executorUri=s3://other-bucket/x?region=r"))
    uris = {
        name: value
        for deployment in ("llmbatch-operator", "llmbatch-gateway")
        for name, value in (
            (e["name"], e.get("value")) for e in _container(objects, deployment)["env"]
        )
        if name in ("LLMBATCH_STORE_URI", "LLMBATCH_EXECUTOR_STORE_URI")
    }
    assert set(uris) == {"LLMBATCH_STORE_URI", "LLMBATCH_EXECUTOR_STORE_URI"}
    for uri in uris.values():
        config = parse_store_uri(uri)
        assert config.sse == params["sse"]  # type: ignore[union-attr]
        assert config.sse_kms_key_id == params.get("sse_kms_key_id")  # type: ignore[union-attr]
    assert parse_store_uri(uris["LLMBATCH_EXECUTOR_STORE_URI"]).bucket == "other-bucket"  # type: ignore[union-attr]
    plain = {e["name"]: e.get("value") for e in _container(render(), "llmbatch-operator")["env"]}
    assert "sse" not in plain["LLMBATCH_STORE_URI"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ("store.uri=file:///var/lib/llmbatch", "store.encryption.mode=sse-s3"),
            "needs an s3:// store URI",
        ),
        (("store.encryption.kmsKeyID=k",), "needs store.encryption.mode sse-kms"),
        (
            ("store.uri=s3://bkt?sse=AES256", "store.encryption.mode=sse-s3"),
            "set encryption in store.encryption",
        ),
        (("store.encryption.mode=sse-c",), "value must be one of"),
    ],
)
def test_store_encryption_refuses_what_it_cannot_apply(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART), "--set", "image.registry=r", "--set", "store.uri=s3://b"]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_slot_settings_reach_the_operator() -> None:
    """The warm-slot settings are chart values (docs/operations.md), not extraEnv only."""
    objects = render(
        sets=(
            "operator.slots.heartbeatSeconds=3",
            "operator.slots.leaseSeconds=20",
            "operator.slots.pollSeconds=2",
        )
    )
    env = {e["name"]: e.get("value") for e in _container(objects, "llmbatch-operator")["env"]}
    assert env["LLMBATCH_SLOT_HEARTBEAT_SECONDS"] == "3"
    assert env["LLMBATCH_SLOT_LEASE_SECONDS"] == "20"
    assert env["LLMBATCH_SLOT_POLL_SECONDS"] == "2"
    defaults = {e["name"]: e.get("value") for e in _container(render(), "llmbatch-operator")["env"]}
    assert (
        defaults["LLMBATCH_SLOT_HEARTBEAT_SECONDS"],
        defaults["LLMBATCH_SLOT_LEASE_SECONDS"],
    ) == (
        "5",
        "30",
    )


def test_a_restarted_operator_is_its_own_peer() -> None:
    """kopf's peer identity is the pod (POD_ID): a container restarted in its pod is not held
    off by its own stale entry; a replacement pod waits the peering lifetime at most."""
    env = {e["name"]: e for e in _container(render(), "llmbatch-operator")["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["LLMBATCH_PEERING_LIFETIME"]["value"] == "20"
    objects = render(sets=("operator.peeringLifetimeSeconds=45",))
    env = {e["name"]: e for e in _container(objects, "llmbatch-operator")["env"]}
    assert env["LLMBATCH_PEERING_LIFETIME"]["value"] == "45"


def test_key_secrets_in_their_own_namespace_bound_the_gateways_secret_access() -> None:
    """RBAC cannot narrow a list/watch of Secrets by label: with gateway.keysNamespace the
    gateway's Secret access is that namespace only, never the release namespace's (Ingress
    certificate, store credentials, Helm's release records)."""
    sets = ("gateway.keysNamespace=llmbatch-keys",)
    objects = render(sets=sets)
    gateway = granted(objects)["llmbatch-gateway"]
    with_secrets = {scope for scope, resources in gateway.items() if "secrets" in resources}
    assert with_secrets == {"llmbatch-keys"}
    env = {e["name"]: e for e in _container(objects, "llmbatch-gateway")["env"]}
    assert env["LLMBATCH_GATEWAY_NAMESPACE"]["value"] == "llmbatch-keys"
    namespace = _find(objects, "Namespace", "llmbatch-keys")
    assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    default = granted(render())["llmbatch-gateway"]
    assert {s for s, r in default.items() if "secrets" in r} == {"llmbatch-system"}


def test_metrics_never_on_the_api_service() -> None:
    objects = render()
    api = _find(objects, "Service", "llmbatch-gateway")
    assert [p["name"] for p in api["spec"]["ports"]] == ["http"]
    assert "llmbatch.io/metrics" not in api["metadata"]["labels"]
    gateway = _container(objects, "llmbatch-gateway")
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["LLMBATCH_GATEWAY_METRICS_PORT"] == "9090"
    assert env["LLMBATCH_GATEWAY_DOCS"] == "false"
    assert {p["name"]: p["containerPort"] for p in gateway["ports"]} == {
        "http": 8080,
        "metrics": 9090,
    }
    metrics = _find(objects, "Service", "llmbatch-gateway-metrics")
    assert [(p["name"], p["port"]) for p in metrics["spec"]["ports"]] == [("metrics", 9090)]
    monitor = _find(render(sets=("serviceMonitor.enabled=true",)), "ServiceMonitor", "llmbatch")
    assert monitor["spec"]["selector"]["matchLabels"]["llmbatch.io/metrics"] == "true"
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def _egress_ports(policy: dict[str, Any]) -> list[set[int]]:
    return [{p["port"] for p in rule["ports"]} for rule in policy["spec"]["egress"]]


@pytest.mark.parametrize(
    ("uri", "ports"),
    [
        ("s3://b/p?region=eu-west-1", {443}),
        ("s3://b/p?endpoint_url=http://minio.store:9000&path_style=true", {9000}),
        ("s3://b/p?endpoint_url=http%3A%2F%2Fminio.store%3A9001", {9001}),
        ("s3://b/p?region=x&endpoint_url=http://rgw.ceph", {80}),
        ("s3://b/p?endpoint_url=https://s3.example.com", {443}),
    ],
)
def test_network_policies_confine_every_component(uri: str, ports: set[int]) -> None:
    objects = render(sets=(f"store.uri={uri}",))
    dns = {53}
    executors = _find(objects, "NetworkPolicy", "llmbatch-executors")
    assert executors["metadata"]["namespace"] == "llmbatch-workers"
    assert executors["spec"]["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/component": "executor"}
    }
    assert executors["spec"]["ingress"] == []
    assert _egress_ports(executors) == [dns, ports]
    for name in ("llmbatch-operator", "llmbatch-gateway"):
        policy = _find(objects, "NetworkPolicy", name)
        # The operator also reaches webhook receivers (operator.webhooks, docs/webhooks.md).
        webhooks = [{443, 80}] if name == "llmbatch-operator" else []
        assert _egress_ports(policy) == [dns, ports, {443, 6443}, *webhooks], name
    gateway = _find(objects, "NetworkPolicy", "llmbatch-gateway")
    assert [{p["port"] for p in r["ports"]} for r in gateway["spec"]["ingress"]] == [
        {8080},
        {9090},
    ]
    assert not [
        o for o in render(sets=("networkPolicy.enabled=false",)) if o["kind"] == "NetworkPolicy"
    ]


NON_PUBLIC_V4 = {
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
}
NON_PUBLIC_V6 = {"fc00::/7", "fe80::/10", "::1/128"}


def _public_only(peers: list[dict[str, Any]]) -> bool:
    """Whether ``peers`` are every address but the private, shared, link-local, loopback and
    unique-local ranges (the chart's default for the store and for remote media)."""
    blocks = {p["ipBlock"]["cidr"]: set(p["ipBlock"]["except"]) for p in peers}
    return blocks == {"0.0.0.0/0": NON_PUBLIC_V4, "::/0": NON_PUBLIC_V6}


def test_default_egress_to_the_store_and_remote_media_reaches_public_addresses_only() -> None:
    objects = render(sets=("remoteMedia.enabled=true",))
    executors = _find(objects, "NetworkPolicy", "llmbatch-executors")
    dns, store, media = executors["spec"]["egress"]
    assert "ipBlock" not in json.dumps(dns)
    assert _public_only(store["to"])
    assert _public_only(media["to"])
    for name in ("llmbatch-operator", "llmbatch-gateway"):
        assert _public_only(_find(objects, "NetworkPolicy", name)["spec"]["egress"][1]["to"])
    # peers given: exactly those
    minio = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "minio"}}}
    given = render(
        sets=(
            "remoteMedia.enabled=true",
            "networkPolicy.store.to[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=minio",
            "remoteMedia.to[0].ipBlock.cidr=203.0.113.0/24",
        )
    )
    egress = _find(given, "NetworkPolicy", "llmbatch-executors")["spec"]["egress"]
    assert egress[1]["to"] == [minio]
    assert egress[2]["to"] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]


def test_remote_media_settings_reach_the_operator() -> None:
    objects = render(
        sets=(
            "remoteMedia.enabled=true",
            "remoteMedia.maxBytes=1048576",
            "remoteMedia.timeoutSeconds=7",
            "remoteMedia.allowedNetworks={10.1.0.0/16,fd00::/8}",
        )
    )
    operator = _find(objects, "Deployment", "llmbatch-operator")
    env = {
        e["name"]: e.get("value")
        for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["LLMBATCH_REMOTE_MEDIA"] == "true"
    assert env["LLMBATCH_REMOTE_MEDIA_MAX_BYTES"] == "1048576"
    assert env["LLMBATCH_REMOTE_MEDIA_TIMEOUT"] == "7"
    assert env["LLMBATCH_REMOTE_MEDIA_ALLOWED_NETWORKS"] == "10.1.0.0/16,fd00::/8"


def test_ingress_with_a_cert_manager_certificate() -> None:
    sets = (
        "gateway.ingress.enabled=true",
        "gateway.ingress.host=llmbatch.example.com",
        "gateway.ingress.tls.issuerRef.name=letsencrypt",
    )
    objects = render(sets=sets, api_versions=("cert-manager.io/v1/Certificate",))
    ingress = _find(objects, "Ingress", "llmbatch-gateway")
    assert ingress["spec"]["tls"] == [
        {"hosts": ["llmbatch.example.com"], "secretName": "llmbatch-gateway-tls"}
    ]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "llmbatch-gateway", "port": {"name": "http"}}
    certificate = _find(objects, "Certificate", "llmbatch-gateway")
    assert certificate["spec"]["secretName"] == "llmbatch-gateway-tls"
    assert certificate["spec"]["issuerRef"]["name"] == "letsencrypt"
    own_secret = render(sets=sets[:2], api_versions=("cert-manager.io/v1/Certificate",))
    assert not [o for o in own_secret if o["kind"] == "Certificate"]


@pytest.mark.parametrize(
    ("mode", "installed"), [("auto", True), ("always", True), ("never", False)]
)
def test_kopf_peering_crd_is_optional(mode: str, installed: bool) -> None:
    # `helm template` has no cluster: `auto` finds no CRD and installs it (the install test and
    # a second release on one cluster exercise the lookup).
    names = {
        o["metadata"]["name"]
        for o in render(sets=(f"crds.kopfPeering={mode}",))
        if o["kind"] == "CustomResourceDefinition"
    }
    assert ("clusterkopfpeerings.kopf.dev" in names) is installed
    assert "batches.llmbatch.io" in names


def test_crds_follow_enabled_and_keep() -> None:
    kept = [o for o in render() if o["kind"] == "CustomResourceDefinition"]
    assert kept
    assert all(o["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for o in kept)
    dropped = [
        o for o in render(sets=("crds.keep=false",)) if o["kind"] == "CustomResourceDefinition"
    ]
    assert dropped
    assert all("annotations" not in o["metadata"] for o in dropped)
    assert not [
        o for o in render(sets=("crds.enabled=false",)) if o["kind"] == "CustomResourceDefinition"
    ]


MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


@pytest.mark.parametrize(
    ("api_versions", "sets", "installed"),
    [((MAP_API,), (), True), ((), (), False), ((MAP_API,), ("batchFinalizerPolicy=false",), False)],
    ids=["served", "not-served", "disabled"],
)
def test_the_finalizer_policy_where_the_api_server_serves_it(
    api_versions: tuple[str, ...], sets: tuple[str, ...], installed: bool
) -> None:
    """The policy that puts the operator's finalizer on Batches at create, named after the
    release, bound to itself; left out on clusters before 1.36 (the operator adds it there)."""
    objects = render(sets=sets, api_versions=api_versions)
    kinds = {o["kind"]: o for o in objects if o["kind"].startswith("MutatingAdmissionPolicy")}
    if not installed:
        assert kinds == {}
        return
    policy, binding = kinds["MutatingAdmissionPolicy"], kinds["MutatingAdmissionPolicyBinding"]
    assert policy["metadata"]["name"].startswith(
        objects[0]["metadata"]["labels"]["app.kubernetes.io/instance"]
    )
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["resources"] == ["batches"]
    assert rule["operations"] == ["CREATE"]
    assert "llmbatch.io/cleanup" in policy["spec"]["mutations"][0]["jsonPatch"]["expression"]


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_every_pod_is_restricted(values: pathlib.Path) -> None:
    specs = pod_specs(render(values))
    assert specs
    for name, spec in specs:
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] is True, name
        assert pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for container in spec["containers"] + spec.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert container["command"], f"{name}: the command must not rely on the image"
            assert container.get("resources", {}).get("limits", {}).get("memory"), name


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("operator.replicas=2",), "additional properties 'replicas' not allowed"),
        (("gateway.port=http",), "got string, want integer"),
        (("image.pullPolicy=Sometimes",), "value must be one of"),
        (("workerNamespaces.names[0]=Bad_Name",), "does not match pattern"),
        (("typo=1",), "additional properties 'typo' not allowed"),
        (("crds.kopfPeering=sometimes",), "value must be one of"),
        (("store.credentialsSecret=x",), "additional properties 'credentialsSecret' not allowed"),
        (("operator.slots.leaseSeconds=0",), "leaseSeconds"),
    ],
)
def test_schema_rejects_bad_values(sets: tuple[str, ...], message: str) -> None:
    args = ["template", "t", str(CHART)]
    for item in sets:
        args += ["--set", item]
    result = helm(*args, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_values_schema_and_readme_are_generated() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "gen_chart.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(schema["properties"]) == set(values)


def test_rbac_matches_golden_file() -> None:
    rendered = granted(render())
    assert rendered == load_golden(), (
        f"RBAC changed; if intended, review it and write:\n{dump_grants(rendered)}\n"
        f"to {GOLDEN_RBAC.relative_to(ROOT)}"
    )


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda p: p.stem)
def test_rbac_is_least_privilege(values: pathlib.Path) -> None:
    objects = render(values)
    for obj in objects:
        if obj["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in obj["rules"]:
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            assert not FORBIDDEN_VERBS & set(rule["verbs"]), where
            assert "*" not in rule["resources"], where
            assert "*" not in rule["apiGroups"], where
            assert "resourceNames" not in rule or rule["resourceNames"], where
            if obj["kind"] == "ClusterRole":
                assert "secrets" not in rule["resources"], f"{where}: cluster-wide Secret access"
    grants = granted(objects)
    for account, scopes in grants.items():
        for scope, resources in scopes.items():
            if scope != CLUSTER:
                continue
            assert "jobs.batch" not in resources, f"{account}: Jobs outside worker namespaces"
            assert "pods" not in resources, f"{account}: Pods outside worker namespaces"


def test_observability_value_set_renders_dashboard_and_rules() -> None:
    """hack/chart-values/observability.yaml: the dashboard ConfigMap for the Grafana sidecar and
    the PrometheusRule with the rule file's groups, alert labels, runbook URLs and one alert left
    out; neither exists by default."""
    objects = render(ROOT / "hack" / "chart-values" / "observability.yaml")
    dashboards = [
        o for o in objects if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    ]
    assert len(dashboards) == 1
    assert dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    model = json.loads(dashboards[0]["data"]["llm-batch-operator.json"])
    assert model["uid"] == "llmbatch-overview"
    assert json.loads((CHART / "files" / "dashboard.json").read_text()) == model
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    source = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    rendered = {
        r.get("alert") or r["record"]: r for g in rule["spec"]["groups"] for r in g["rules"]
    }
    wanted = {r.get("alert") or r["record"] for g in source["groups"] for r in g["rules"]}
    assert set(rendered) == wanted - {"LLMBatchSlotsUnfilledWithBacklog"}
    for name, item in rendered.items():
        if "alert" in item:
            assert item["labels"]["team"] == "ml-platform"
            assert item["annotations"]["runbook_url"] == (
                "https://github.com/example/llm-batch-operator/blob/main/docs/operations.md#"
                + name.lower()
            )
    kinds = {o["kind"] for o in render()}
    assert "PrometheusRule" not in kinds
    assert not [
        o for o in render() if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    ]


def test_per_tenant_metrics_are_opt_in() -> None:
    env = {e["name"]: e for e in _container(render(), "llmbatch-operator")["env"]}
    assert env["LLMBATCH_METRICS_TENANT_LABELS"]["value"] == "false"
    objects = render(sets=("operator.metricsTenantLabels=true",))
    env = {e["name"]: e for e in _container(objects, "llmbatch-operator")["env"]}
    assert env["LLMBATCH_METRICS_TENANT_LABELS"]["value"] == "true"
