"""The stack the fault suite breaks: a real control plane, the operator and the gateway as their
own processes, executor pods as local processes, all reaching a real S3 server (versitygw)
through Toxiproxy (TCP faults) and the S3 error proxy (``s3errors``: S3 error answers). The
suite runs in its own pytest session (``make faults``; ``make test`` runs it after the other
tiers): its operator owns the cluster it starts.
"""

from __future__ import annotations

import json
import os
import pathlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from llmbatch.storage import open_store
from tests.faults.s3errors import S3Errors, running_s3_errors
from tests.faults.toxiproxy import Toxiproxy, running_toxiproxy
from tests.fixtures.cluster import kubectl
from tests.fixtures.gateway import GatewayProcess, wait_for_key
from tests.fixtures.operator import ROOT, WORKER_NAMESPACE, OperatorProcess, simulated_pool
from tests.fixtures.ports import free_port
from tests.fixtures.s3server import S3Server

POOL = "faults-sim"
MAX_SLOTS = 3
MODEL = "fault-model"
GATEWAY_NAMESPACE = "llmbatch-gateway-faults"


@dataclass
class FaultStack:
    """Everything an iteration needs to break and to check."""

    kubeconfig: str
    s3: S3Server
    bucket: str
    toxiproxy: Toxiproxy
    proxy: str
    """Name of the Toxiproxy proxy in front of the S3 server."""
    s3_errors: S3Errors
    """The proxy between Toxiproxy and the S3 server that answers planned S3 errors."""
    operator: OperatorProcess
    gateway: GatewayProcess
    tenant: str
    key: str

    def kubectl(self, *args: str, check: bool = True) -> str:
        return kubectl(pathlib.Path(self.kubeconfig), *args, check=check).stdout

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def store_faults(self, rules: list[dict[str, Any]] | None) -> int:
        """Set (or with None clear) the S3 error plan; the faults answered so far."""
        return self.s3_errors.plan(rules)

    def assignments_of(self, uid: str) -> list[str]:
        """Assignment objects of the batch still in a slot channel of the pool (the store read
        directly, not through Toxiproxy)."""
        store = open_store(self.s3.uri(self.bucket))
        return [
            info.key
            for info in store.list(f"slots/{POOL}/")
            if "/assignments/" in info.key and info.key.rsplit("/", 1)[1].startswith(uid)
        ]

    def clear(self) -> None:
        self.toxiproxy.reset()
        self.store_faults(None)


def sweep_pool(name: str, worker_namespace: str) -> dict[str, Any]:
    """The pool every sweep runs its batches on: the simulated engine, small shards, at most
    :data:`MAX_SLOTS` slots, retries enough to outlive the faults."""
    return simulated_pool(
        name,
        MODEL,
        worker_namespace=worker_namespace,
        shardRequests=5,
        maxSlots=MAX_SLOTS,
        executor={"engineArgs": ["--latency-seconds=0.05"], "backoffLimit": 6},
    )


def tenant(kubeconfig: pathlib.Path, gateway_namespace: str) -> tuple[str, str]:
    """A new tenant namespace with credit and an API key: (namespace, key)."""
    from llmbatch.gateway.auth import hash_key, key_secret, new_api_key

    namespace = f"tenant-faults-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    key = new_api_key()
    secret = key_secret(
        f"key-{namespace}",
        hash_key(key),
        namespace,
        ["inference:write", "inference:read"],
        gateway_namespace,
    )
    kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(secret))
    account = {
        "apiVersion": "llmbatch.io/v1alpha1",
        "kind": "CreditAccount",
        "metadata": {"name": "default", "namespace": namespace},
        "spec": {"limit": "1000"},
    }
    kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(account))
    return namespace, key


@pytest.fixture(scope="session")
def fault_stack(
    dev_cluster: Any, s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FaultStack]:
    logs = tmp_path_factory.mktemp("fault-logs")
    kubeconfig = pathlib.Path(dev_cluster.kubeconfig)
    upstream = s3_server.endpoint_url.removeprefix("http://")
    with (
        running_s3_errors(free_port(), upstream, logs / "s3errors.log") as s3_errors,
        running_toxiproxy(logs / "toxiproxy.log") as toxiproxy,
    ):
        listen = toxiproxy.create_proxy("s3", s3_errors.address)
        bucket = s3_server.create_bucket()
        # Short client timeouts so a stalled connection fails within the iteration; the
        # default retry budget of the store (5 attempts) stays.
        store_uri = s3_server.uri(
            bucket, endpoint_url=f"http://{listen}", read_timeout=5.0, connect_timeout=2.0
        )
        kubectl(kubeconfig, "apply", "-f", str(ROOT / "crds"))
        kubectl(kubeconfig, "create", "namespace", WORKER_NAMESPACE, check=False)
        kubectl(kubeconfig, "create", "namespace", GATEWAY_NAMESPACE, check=False)
        peering = {
            "apiVersion": "kopf.dev/v1",
            "kind": "ClusterKopfPeering",
            "metadata": {"name": "llmbatch"},
        }
        kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(peering))
        pool = sweep_pool(POOL, WORKER_NAMESPACE)
        kubectl(kubeconfig, "apply", "-f", "-", input=json.dumps(pool))
        operator_logs = logs / "operator"
        operator_logs.mkdir()
        operator = OperatorProcess(str(kubeconfig), logs / "operator-store", operator_logs)
        operator.store_uri = store_uri
        gateway = GatewayProcess(
            str(kubeconfig),
            logs / "gateway-store",
            logs / "gateway.log",
            gateway_namespace=GATEWAY_NAMESPACE,
            docs=None,
        )
        gateway.store_uri = store_uri
        operator.start()
        gateway.start()
        namespace, key = tenant(kubeconfig, GATEWAY_NAMESPACE)
        wait_for_key(gateway.base_url, key, accepted=True, timeout=60)
        stack = FaultStack(
            str(kubeconfig),
            s3_server,
            bucket,
            toxiproxy,
            "s3",
            s3_errors,
            operator,
            gateway,
            namespace,
            key,
        )
        try:
            yield stack
        finally:
            stack.clear()
            gateway.stop()
            operator.stop()
            if os.environ.get("LLMBATCH_FAULT_KEEP_LOGS"):
                print(f"fault suite logs: {logs}")
