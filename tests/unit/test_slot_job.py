"""The slot Job manifest: deterministic, restricted, preemption-aware."""

from __future__ import annotations

from typing import Any

from llmbatch.api.resources import BatchPoolSpec, ModelCache
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import EXIT_BAD_CONFIG, EXIT_PREEMPTED, build_slot_job

POOL = BatchPoolSpec.model_validate(
    {
        "models": [{"name": "smollm2", "source": "/models/smollm2"}],
        "workerNamespace": "workers",
        "gpusPerSlot": 2,
        "nodeSelector": {"nvidia.com/gpu.product": "A100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "executor": {
            "engine": "simulated",
            "storeSecretName": "store-creds",
            "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
        },
    }
)
CONFIG = OperatorConfig(store_uri="file:///s", executor_store_uri="s3://bucket?region=x")


def job(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "config": CONFIG,
        "pool_name": "p",
        "pool": POOL,
        "slot": "p-slot-abc123",
        "spec_key": "slots/p/p-slot-abc123/spec.json",
    }
    args.update(overrides)
    return build_slot_job(**args)


def test_deterministic_named_after_the_slot_and_never_suspended() -> None:
    first, second = job(), job()
    assert first == second
    assert first["metadata"]["name"] == "p-slot-abc123"
    assert first["metadata"]["namespace"] == "workers"
    assert "suspend" not in first["spec"]


def test_pod_is_restricted_and_has_no_token() -> None:
    pod = job()["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    sec = container["securityContext"]
    assert sec["allowPrivilegeEscalation"] is False
    assert sec["capabilities"] == {"drop": ["ALL"]}
    assert sec["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["restartPolicy"] == "Never"


def test_gpus_selector_tolerations_and_secret_reference() -> None:
    pod = job()["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "2"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "A100"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert container["envFrom"] == [{"secretRef": {"name": "store-creds"}}]
    assert {"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"} in container["env"]
    assert container["args"] == ["--slot", "s3://bucket?region=x#slots/p/p-slot-abc123/spec.json"]
    assert {"name": "LLMBATCH_SLOT", "value": "p-slot-abc123"} in container["env"]
    assert not any("SECRET" in e["name"] for e in container["env"])


def test_pod_failure_policy_ignores_preemption_and_fails_bad_config() -> None:
    rules = job()["spec"]["podFailurePolicy"]["rules"]
    by_action = {(r["action"], tuple(r.get("onExitCodes", {}).get("values", []))) for r in rules}
    assert ("Ignore", (EXIT_PREEMPTED,)) in by_action
    assert ("FailJob", (EXIT_BAD_CONFIG,)) in by_action
    assert any(
        r.get("onPodConditions") == [{"type": "DisruptionTarget", "status": "True"}] for r in rules
    )


def test_labels_and_priority_class() -> None:
    manifest = job(
        config=OperatorConfig(
            store_uri="file:///s", executor_store_uri="file:///s", priority_class_prefix="llmbatch"
        ),
    )
    labels = manifest["metadata"]["labels"]
    assert labels["llmbatch.io/pool"] == "p"
    assert labels["llmbatch.io/slot"] == "p-slot-abc123"
    pod = manifest["spec"]["template"]
    assert pod["metadata"]["labels"] == labels
    # A slot serves every tier of its pool: tiers are ordered by the scheduler and the engine.
    assert pod["spec"]["priorityClassName"] == "llmbatch-standard"


def test_model_cache_and_shared_memory_volumes() -> None:
    pool = POOL.model_copy(
        update={
            "executor": POOL.executor.model_copy(
                update={
                    "model_cache": ModelCache(claim_name="weights", mount_path="/models"),
                    "shm_size": "8Gi",
                }
            )
        }
    )
    pod = job(pool=pool)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {
        "claimName": "weights",
        "readOnly": True,
    }
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["model-cache"] == {
        "name": "model-cache",
        "mountPath": "/models",
        "readOnly": True,
    }
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    plain = job()["spec"]["template"]["spec"]
    assert [v["name"] for v in plain["volumes"]] == ["tmp"]


def test_a_slot_pod_has_a_memory_limit_unless_its_pool_says_none() -> None:
    """An out-of-memory kill ends one slot process, not the node's others (docs/executor.md)."""
    resources = job()["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == resources["requests"]["memory"] == "24Gi"
    unlimited = POOL.model_copy(
        update={"executor": POOL.executor.model_copy(update={"memory": None})}
    )
    resources = job(pool=unlimited)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert "memory" not in resources["limits"]
    sized = BatchPoolSpec.model_validate(
        {**POOL.model_dump(by_alias=True), "executor": {"memory": "64Gi"}}
    )
    resources = job(pool=sized)["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources["limits"]["memory"] == "64Gi"
