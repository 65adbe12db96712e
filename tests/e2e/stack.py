"""The stack an end-to-end test drives: a gateway sharing the operator's store, a pool and a
tenant namespace with an API key."""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from llmbatch.commands.devstack import demo_pool
from llmbatch.executor.models import MODELS, cache_dir
from llmbatch.gateway.auth import hash_key, key_secret, new_api_key
from tests.fixtures.gateway import GatewayProcess, wait_for_key
from tests.fixtures.operator import ClusterCLI, OperatorProcess


def prepared_pool(model: str) -> dict[str, Any]:
    """The demo pool (one vLLM slot) of a model prepared in the model cache, under a name of
    its own; the test fails when ``make models`` did not prepare it."""
    known = MODELS[model]
    if not known.is_prepared():
        pytest.fail(f"{model} is not prepared: `make models` runs before the tests")
    pool = demo_pool(str(known.folder()), str(cache_dir()))
    pool["metadata"]["name"] = f"e2e-{model}-{uuid.uuid4().hex[:6]}"
    return pool


@contextlib.contextmanager
def serving(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    log_dir: pathlib.Path,
    pool: dict[str, Any],
) -> Iterator[tuple[GatewayProcess, str, str]]:
    """``pool`` applied, a gateway started and a tenant keyed: (gateway, key, namespace); the
    pool and the namespace are deleted after."""
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    gateway = GatewayProcess(
        str(cluster.kubeconfig), operator_process.store_root, log_dir / "gateway.log"
    )
    gateway.kubectl("create", "namespace", gateway.gateway_namespace, check=False)
    gateway.kubectl("create", "namespace", namespace)
    gateway.kubectl("apply", "-f", "-", obj=pool)
    key = new_api_key()
    scopes = ["inference:write", "inference:read"]
    secret = key_secret(
        f"key-{namespace}", hash_key(key), namespace, scopes, gateway.gateway_namespace
    )
    gateway.kubectl("apply", "-f", "-", obj=secret)
    gateway.start()
    wait_for_key(gateway.base_url, key, accepted=True)
    try:
        yield gateway, key, namespace
    finally:
        gateway.stop()
        gateway.kubectl(
            "delete", "batchpool", pool["metadata"]["name"], "--wait=false", check=False
        )
        gateway.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
