"""Fixtures of the integration tier shared by several modules."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from tests.fixtures.gateway import GatewayProcess, gateway_on_operator_store, keyed_namespace
from tests.fixtures.operator import ClusterCLI, OperatorProcess


@pytest.fixture(scope="module")
def gateway(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[GatewayProcess]:
    """A gateway on the operator's store, one per module that asks for it, with a key
    namespace of its own (``llmbatch-credits-test`` for test_credits.py)."""
    module = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    with gateway_on_operator_store(
        str(cluster.kubeconfig),
        operator_process.store_root,
        tmp_path_factory.mktemp(f"{module}-gateway"),
        f"llmbatch-{module}-test",
    ) as proc:
        yield proc


@pytest.fixture
def tenant(gateway: GatewayProcess) -> Iterator[tuple[str, openai.OpenAI]]:
    """A tenant namespace with a key, and the official SDK's client on it."""
    namespace = f"sdk-{uuid.uuid4().hex[:8]}"
    key = keyed_namespace(gateway, namespace)
    yield namespace, openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    gateway.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
