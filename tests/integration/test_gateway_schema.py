"""Schemathesis against the gateway's own OpenAPI document: no input makes it answer 5xx.

Runs against the real gateway process on the dev cluster, with a valid key of a fresh tenant (so
requests get past auth and reach the Kubernetes and store layers). Every operation gets up to 50
positive and 50 negative examples (hypothesis, derandomised); every answer must be below 500 and
every error must be the OpenAI envelope.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from tests.fixtures.gateway import GatewayProcess, Tenant, auth

pytestmark = pytest.mark.timeout(600)

MAX_EXAMPLES = 50


def _check(response: Any, label: str) -> str | None:
    if response.status_code >= 500:
        return f"{label}: {response.status_code} {response.text[:300]}"
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            return f"{label}: {response.status_code} without the error envelope: {response.text!r}"
        if set(error) != {"message", "type", "param", "code"}:
            return f"{label}: bad envelope {error}"
    return None


def _fuzz(
    operation: Any,
    mode: Any,
    key: str,
    base_url: str,
    failures: list[str],
    statuses: collections.Counter[int],
) -> None:
    label = f"{operation.label} [{mode.value}]"

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
        derandomize=True,
        database=None,
    )
    def run(case: Any) -> None:
        headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
        headers.update(auth(key))  # a valid key, so examples reach the handlers
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        statuses[response.status_code] += 1
        problem = _check(response, label)
        if problem:
            failures.append(problem + f"\n  reproduce: {case.as_curl_command()}")

    run()


def test_no_input_makes_a_server_error(
    gateway_process: GatewayProcess, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant = tenant_factory(annotations={"llmbatch.io/max-queued-requests": "1000000"})
    schema = schemathesis.openapi.from_url(gateway_process.base_url + "/openapi.json")
    failures: list[str] = []
    statuses: collections.Counter[int] = collections.Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _fuzz(operation, mode, tenant.key, gateway_process.base_url, failures, statuses)
    print("answers by status:", dict(sorted(statuses.items())))
    assert not failures, "\n".join(failures[:20])
    assert sum(n for code, n in statuses.items() if code < 300) > 50  # got past auth and checks
