"""The slot Job: one ``batch/v1`` Job per warm slot of a pool, so that
``kubectl get jobs -l llmbatch.io/pool=NAME`` lists the pool's slots."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

import yaml

from llmbatch.api import labels
from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.shard import EngineSpec, MediaLimits
from llmbatch.controller.config import OperatorConfig
from llmbatch.core.podtemplate import creates_suspended, merge_pod_template

LABEL_BATCH_UID = "llmbatch.io/batch-uid"
LABEL_POOL = "llmbatch.io/pool"
LABEL_SLOT = "llmbatch.io/slot"
#: The variable the executor finds its slot by: the operator's, whatever the pool's env says.
SLOT_ENV = "LLMBATCH_SLOT"


def slot_selector(pool_name: str) -> str:
    """The label selector of a pool's slot Jobs and their pods."""
    return f"{LABEL_POOL}={pool_name},{LABEL_SLOT}"


#: The component label of slot Jobs and pods (the chart's executor NetworkPolicy selects it).
SLOT_COMPONENT = "executor"

#: The tier whose PriorityClass slot pods run under (a slot serves every tier of its pool;
#: tiers are ordered inside the pool by the scheduler's queue).
SLOT_PRIORITY_TIER = "standard"

# Exit codes of the executor (llmbatch.executor.exitcodes, sysexits.h): kept here as numbers
# because the controller never imports the executor.
EXIT_PREEMPTED = 75
EXIT_BAD_CONFIG = 78

RESTRICTED_CONTAINER_SECURITY: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


#: Exit codes → Job actions: preemption (SIGTERM → flush → 75) and a node drain are not failures
#: (the pod is replaced); an unusable spec (78) fails the Job; with ``backoffLimit: 0`` so does
#: every other exit (the operator settles the slot's shards and starts another slot).
POD_FAILURE_POLICY: dict[str, Any] = {
    "rules": [
        {
            "action": "Ignore",
            "onExitCodes": {
                "containerName": "executor",
                "operator": "In",
                "values": [EXIT_PREEMPTED],
            },
        },
        {
            "action": "FailJob",
            "onExitCodes": {
                "containerName": "executor",
                "operator": "In",
                "values": [EXIT_BAD_CONFIG],
            },
        },
        {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        },
    ]
}


def engine_args(pool: BatchPoolSpec) -> dict[str, Any]:
    """``--max-num-seqs=64`` style pool arguments as the executor's ``{max_num_seqs: 64}``."""
    args: dict[str, Any] = {}
    for item in pool.executor.engine_args or []:
        name, _, value = item.lstrip("-").partition("=")
        args[name.replace("-", "_")] = yaml.safe_load(value) if value else True
    return args


def engine_spec(config: OperatorConfig, pool: BatchPoolSpec) -> EngineSpec:
    """The engine of the pool's slots and shards: its arguments, the pool's image limits (the
    engine applies them too), and how the executor fetches remote media where it is allowed."""
    media = MediaLimits(
        max_image_pixels=pool.limits.max_image_pixels,
        max_images_per_request=pool.limits.max_images_per_request,
        remote=config.remote_fetch if config.remote_media else None,
    )
    return EngineSpec(name=pool.executor.engine, args=engine_args(pool), media=media)


def _resources(pool: BatchPoolSpec) -> dict[str, dict[str, str]]:
    executor = pool.executor
    resources: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    if pool.gpus_per_slot:
        resources["requests"]["nvidia.com/gpu"] = str(pool.gpus_per_slot)
        resources["limits"]["nvidia.com/gpu"] = str(pool.gpus_per_slot)
    if executor.cpu:
        resources["requests"]["cpu"] = resources["limits"]["cpu"] = executor.cpu
    if executor.memory:
        resources["requests"]["memory"] = resources["limits"]["memory"] = executor.memory
    return resources


def _container(config: OperatorConfig, pool: BatchPoolSpec, name: str, spec_key: str) -> Any:
    """The executor container: the slot spec's location, env, resources, store credentials."""
    executor = pool.executor
    env = [{"name": SLOT_ENV, "value": name}]
    env += [e.to_k8s() for e in executor.env or [] if e.name != SLOT_ENV]
    container: dict[str, Any] = {
        "name": "executor",
        "image": executor.image,
        "command": [*config.executor_command],
        "args": ["--slot", f"{config.executor_store_uri}#{spec_key}"],
        "env": env,
        "resources": _resources(pool),
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    # Store credentials reach every component the same way: a Secret's keys as environment
    # variables (boto3's chain). The pool's own Secret wins over the operator-wide default.
    store_secret = executor.store_secret_name or config.executor_store_secret
    if store_secret:
        container["envFrom"] = [{"secretRef": {"name": store_secret}}]
    return container


def _pod_spec(config: OperatorConfig, pool: BatchPoolSpec, tier: str, container: Any) -> Any:
    """Restricted pod security, volumes (tmp, model cache, /dev/shm), placement, priority."""
    executor = pool.executor
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": executor.termination_grace_seconds,
        # No runAsUser: the image's numeric USER (65532) runs, or the uid the platform assigns
        # (OpenShift's restricted SCC); runAsNonRoot has the kubelet refuse root either way.
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if executor.model_cache:
        cache = executor.model_cache
        claim = {"claimName": cache.claim_name, "readOnly": cache.read_only}
        pod_spec["volumes"].append({"name": "model-cache", "persistentVolumeClaim": claim})
        container["volumeMounts"].append(
            {"name": "model-cache", "mountPath": cache.mount_path, "readOnly": cache.read_only}
        )
    if executor.shm_size:
        pod_spec["volumes"].append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": executor.shm_size}}
        )
        container["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    if executor.service_account_name:
        pod_spec["serviceAccountName"] = executor.service_account_name
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = [t.to_k8s() for t in pool.tolerations]
    if config.priority_class_prefix:
        pod_spec["priorityClassName"] = f"{config.priority_class_prefix}-{tier}"
    return pod_spec


def build_slot_job(
    *,
    config: OperatorConfig,
    pool_name: str,
    pool: BatchPoolSpec,
    slot: str,
    spec_key: str,
) -> dict[str, Any]:
    """The Job manifest of one slot (deterministic: the same inputs give the same object).

    ``backoffLimit: 0``: a slot pod that fails ends its slot, so failures never accumulate over
    a warm slot's long life (a store blip at start, a crash, a bad node: each is one slot's
    end, not a step toward a budget that a later, unrelated failure exhausts). The operator
    settles its shards — one attempt for what it ran (``core.leases.settle``) — and starts
    another slot when the backlog wants one. Preemption (exit 75) and disruption (a node
    drain) are ignored by the pod failure policy: the Job replaces that pod under the same
    slot, which resumes its assignments from their committed chunks.

    The pool's ``executor.podTemplate`` is merged under the operator's fields
    (``core.podtemplate``); a pool that asks for it (or names a Kueue queue) gets its Jobs
    created suspended, for the admission controller to resume.
    """
    owned = {
        LABEL_POOL: pool_name,
        LABEL_SLOT: slot,
        **labels.recommended_labels(
            name=labels.EXECUTOR, instance=pool_name, component=SLOT_COMPONENT
        ),
    }
    container = _container(config, pool, slot, spec_key)
    pod_spec = _pod_spec(config, pool, SLOT_PRIORITY_TIER, container)
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": slot, "namespace": pool.worker_namespace, "labels": owned},
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": 0,
            "podFailurePolicy": copy.deepcopy(POD_FAILURE_POLICY),
            "template": {"metadata": {"labels": dict(owned)}, "spec": pod_spec},
        },
    }
    if creates_suspended(pool.executor):
        job["spec"]["suspend"] = True
    return merge_pod_template(job, pool.executor.pod_template)


def job_suspended(job: dict[str, Any]) -> bool:
    """A slot Job that waits for admission (``spec.suspend``): it has no pod, so it has not
    failed to start; Kueue (or whoever created it suspended) resumes it."""
    return bool((job.get("spec") or {}).get("suspend"))


def slot_revision(
    config: OperatorConfig, pool: BatchPoolSpec, model_name: str, pinned: str | None = None
) -> str | None:
    """A digest of everything that shapes a slot of ``model_name`` (its pod template, its
    model, engine, concurrency and idle time), or None when the pool no longer serves the model.
    ``pinned``: the model revision the slot serves, when not the pool's current one.

    The scheduler stamps it on each slot Job; a slot whose stamp differs from its pool's current
    one was started before an edit, takes no new shard and drains (``docs/pools.md``). An edit
    of a model's revision alone leaves a slot pinned to the old one current for the batches
    pinned to it.
    """
    model = next((m for m in pool.models if m.name == model_name), None)
    if model is None:
        return None
    if pinned is not None:
        model = model.model_copy(update={"revision": pinned})
    job = build_slot_job(config=config, pool_name="", pool=pool, slot="", spec_key="")
    shape = {
        "template": job["spec"]["template"],
        "backoffLimit": job["spec"]["backoffLimit"],
        "model": model.model_dump(mode="json"),
        "engine": engine_spec(config, pool).model_dump(mode="json"),
        "slotConcurrency": pool.slot_concurrency,
        "idleSeconds": pool.idle_seconds,
    }
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
    return digest[:16]


class SlotShapes:
    """:func:`slot_revision` of a pool's models, each (model, pinned revision) computed once a
    round rather than once a slot."""

    def __init__(self, config: OperatorConfig, pool: BatchPoolSpec) -> None:
        self.config = config
        self.pool = pool
        self._digests: dict[tuple[str, str | None], str | None] = {}

    def of(self, model_name: str, pinned: str | None) -> str | None:
        key = (model_name, pinned)
        if key not in self._digests:
            self._digests[key] = slot_revision(self.config, self.pool, model_name, pinned)
        return self._digests[key]
