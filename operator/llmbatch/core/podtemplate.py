"""A pool's pod template merged under the slot Job the operator builds.

Precedence, one rule per field (docs/install.md#shaping-slot-pods):

- labels and annotations: the template's go on the Job and on its pod; a key the operator sets
  (``llmbatch.io/*``, the recommended ``app.kubernetes.io/*`` labels) keeps the operator's value;
- nodeSelector: the template's keys are added, the pool's ``spec.nodeSelector`` wins on a key;
- tolerations: the template's are added after the pool's ``spec.tolerations``;
- affinity and topologySpreadConstraints: the template's (the operator sets none);
- priorityClassName: the template's replaces the operator's tier class (a pool's own choice);
- volumes and volumeMounts: added, except a volume named like one of the operator's or a mount at
  a path the operator mounts (the operator's stay).

Everything else — the executor's command, arguments, resources, security context, its own
environment and volumes, restart and failure policies — is the operator's alone.
"""

from __future__ import annotations

import copy
from typing import Any

from llmbatch.api.resources import ExecutorSpec, PodTemplate

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The label Kueue admits a Job by: its LocalQueue."""


def creates_suspended(executor: ExecutorSpec) -> bool:
    """Whether slot Jobs of the pool are created with ``spec.suspend: true``: the pool asks for
    it, or its Jobs carry Kueue's queue label (Kueue admits a Job by resuming it)."""
    template = executor.pod_template
    metadata = template.metadata if template else None
    labels = (metadata.labels if metadata else None) or {}
    return executor.create_suspended or KUEUE_QUEUE_LABEL in labels


def _under(template: dict[str, str] | None, owned: dict[str, str] | None) -> dict[str, str]:
    """The template's map with the operator's keys over it."""
    return {**(template or {}), **(owned or {})}


def _merge_metadata(job: dict[str, Any], template: PodTemplate) -> None:
    if template.metadata is None:
        return
    labels, annotations = template.metadata.labels, template.metadata.annotations
    for meta in (job["metadata"], job["spec"]["template"]["metadata"]):
        if labels:
            meta["labels"] = _under(labels, meta.get("labels"))
        if annotations:
            meta["annotations"] = _under(annotations, meta.get("annotations"))


def _merge_placement(pod: dict[str, Any], template: PodTemplate) -> None:
    if template.node_selector:
        pod["nodeSelector"] = _under(template.node_selector, pod.get("nodeSelector"))
    if template.tolerations:
        pod["tolerations"] = [
            *pod.get("tolerations", []),
            *(t.to_k8s() for t in template.tolerations),
        ]
    if template.affinity is not None:
        pod["affinity"] = template.affinity.to_k8s()
    if template.topology_spread_constraints:
        pod["topologySpreadConstraints"] = [
            c.to_k8s() for c in template.topology_spread_constraints
        ]
    if template.priority_class_name:
        pod["priorityClassName"] = template.priority_class_name


def _merge_volumes(pod: dict[str, Any], template: PodTemplate) -> None:
    container = pod["containers"][0]
    volumes: list[dict[str, Any]] = pod.setdefault("volumes", [])
    mounts: list[dict[str, Any]] = container.setdefault("volumeMounts", [])
    owned_volumes = {v["name"] for v in volumes}
    owned_paths = {m["mountPath"].rstrip("/") for m in mounts}
    volumes += [v.to_k8s() for v in template.volumes or [] if v.name not in owned_volumes]
    mounts += [
        m.to_k8s()
        for m in template.volume_mounts or []
        if m.name not in owned_volumes and m.mount_path.rstrip("/") not in owned_paths
    ]


def merge_pod_template(job: dict[str, Any], template: PodTemplate | None) -> dict[str, Any]:
    """The slot Job ``job`` with ``template`` merged under the fields the operator set (a new
    object; ``job`` is left as it was)."""
    if template is None:
        return job
    merged = copy.deepcopy(job)
    _merge_metadata(merged, template)
    pod = merged["spec"]["template"]["spec"]
    _merge_placement(pod, template)
    _merge_volumes(pod, template)
    return merged
