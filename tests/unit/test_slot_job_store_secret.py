"""Store credentials of slot pods: the pool's Secret, else the operator-wide default (the chart's
``store.secretName``), as environment variables like the operator's and the gateway's."""

from __future__ import annotations

from typing import Any

import pytest

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import build_slot_job


def _pool(**executor: Any) -> BatchPoolSpec:
    return BatchPoolSpec.model_validate(
        {
            "models": [{"name": "m", "source": "/models/m"}],
            "workerNamespace": "workers",
            "executor": {"engine": "simulated", **executor},
        }
    )


def _env_from(pool: BatchPoolSpec, config: OperatorConfig) -> Any:
    job = build_slot_job(
        config=config,
        pool_name="p",
        pool=pool,
        slot="p-slot-1",
        spec_key="slots/p/p-slot-1/spec.json",
    )
    return job["spec"]["template"]["spec"]["containers"][0].get("envFrom")


@pytest.mark.parametrize(
    ("pool_secret", "default", "expected"),
    [
        (None, None, None),
        (None, "llmbatch-store", "llmbatch-store"),
        ("pool-creds", "llmbatch-store", "pool-creds"),
        ("pool-creds", None, "pool-creds"),
    ],
)
def test_pool_secret_wins_over_the_operator_default(
    pool_secret: str | None, default: str | None, expected: str | None
) -> None:
    config = OperatorConfig(
        store_uri="s3://b", executor_store_uri="s3://b", executor_store_secret=default
    )
    executor = {"storeSecretName": pool_secret} if pool_secret else {}
    env_from = _env_from(_pool(**executor), config)
    if expected is None:
        assert env_from is None
    else:
        assert env_from == [{"secretRef": {"name": expected}}]


def test_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBATCH_STORE_URI", "s3://b")
    monkeypatch.setenv("LLMBATCH_EXECUTOR_STORE_SECRET", "llmbatch-store")
    assert OperatorConfig.from_env().executor_store_secret == "llmbatch-store"
    monkeypatch.setenv("LLMBATCH_EXECUTOR_STORE_SECRET", "")
    assert OperatorConfig.from_env().executor_store_secret is None
