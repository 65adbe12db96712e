"""What a BatchPool may shape of its slot pods (``spec.executor.podTemplate``): the core/v1
fields platform teams set on workloads — labels and annotations, affinity, topology spread,
tolerations, a priority class, extra volumes and their mounts — in the shapes of core/v1, each
bounded. The operator merges the template under the fields it owns (``core.podtemplate``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints
from pydantic.config import JsonDict

from llmbatch.api.resources.base import CRModel
from llmbatch.api.resources.fields import DNSName, Label, Quantity, ShortText

LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=317)]
"""A label key: an optional DNS prefix (253) and '/' and a name (63)."""
LabelValue = Annotated[
    str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
]
"""A label value: empty, or alphanumerics with '-', '_', '.' inside."""
DNSLabel = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
"""An RFC 1123 label: the name of a volume."""
AbsolutePath = Annotated[str, StringConstraints(pattern=r"^/", max_length=512)]

_QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _qualified_keys(field: str) -> JsonDict:
    """The CEL rule that every key of the map ``field`` is a qualified name (``[prefix/]name``,
    as label, annotation and node-selector keys are): a structural schema cannot constrain map
    keys, so the API server checks them with this rule."""
    return {
        "rule": f"!has(self.{field}) || self.{field}.all(k, k.matches('{_QUALIFIED_NAME}'))",
        "message": f"{field} keys must be [prefix/]name",
    }


#: Volumes and mount paths the operator gives every slot pod (jobs.py): a template's own may
#: not take their names.
RESERVED_VOLUMES = ("tmp", "model-cache", "dshm")


class LabelRequirement(CRModel):
    """One requirement of a label selector (as in meta/v1 LabelSelectorRequirement)."""

    key: LabelKey
    """The label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the label's value relates to values."""
    values: Annotated[list[Label], Field(max_length=64)] | None = None
    """Values for In and NotIn."""


class LabelSelector(CRModel):
    """Objects by label (as a meta/v1 LabelSelector: every term must hold)."""

    match_labels: (
        Annotated[
            dict[Annotated[str, StringConstraints(max_length=317)], Label], Field(max_length=32)
        ]
        | None
    ) = None
    """Labels the object must carry with exactly these values."""
    match_expressions: Annotated[list[LabelRequirement], Field(max_length=16)] | None = None
    """Further requirements on the object's labels."""


class Toleration(CRModel):
    """A pod toleration (as in core/v1)."""

    key: ShortText | None = None
    """Taint key; empty with operator Exists matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal."""
    value: ShortText | None = None
    """Taint value for Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all."""
    toleration_seconds: int | None = None
    """How long a NoExecute taint is tolerated."""


class KeySelector(CRModel):
    """One key of a Secret or ConfigMap in the pool's worker namespace."""

    name: DNSName
    """Name of the Secret or ConfigMap."""
    key: DNSName
    """The key whose value is taken."""
    optional: bool | None = None
    """Start the pod even when the object or the key is missing."""


class FieldRef(CRModel):
    """A field of the pod itself (the downward API), e.g. metadata.name or spec.nodeName."""

    field_path: ShortText
    """Path of the field, e.g. status.hostIP."""
    api_version: Literal["v1"] | None = None
    """Version of the path's schema."""


class EnvVarSource(CRModel):
    """Where a variable's value comes from: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.secretKeyRef), has(self.configMapKeyRef),"
                    " has(self.fieldRef)].filter(x, x).size() == 1",
                    "message": "exactly one of secretKeyRef, configMapKeyRef and fieldRef",
                }
            ]
        }
    )

    secret_key_ref: KeySelector | None = None
    """A key of a Secret."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: FieldRef | None = None
    """A field of the pod."""


class EnvVar(CRModel):
    """An environment variable of slot pods: a value, or a value from a Secret, a ConfigMap or
    the pod's own fields (a variable the operator sets itself, LLMBATCH_SLOT, wins)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.valueFrom) || !has(self.value) || self.value == ''",
                    "message": "value and valueFrom are exclusive",
                }
            ]
        }
    )

    name: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    """Variable name."""
    value: Annotated[str, StringConstraints(max_length=4096)] = ""
    """Variable value."""
    value_from: EnvVarSource | None = None
    """Take the value from a Secret, a ConfigMap or a pod field instead."""


class NodeSelectorRequirement(CRModel):
    """A requirement on a node's labels (or fields)."""

    key: LabelKey
    """The label key (or field name)."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the node's value relates to values."""
    values: Annotated[list[Label], Field(max_length=64)] | None = None
    """Values for In, NotIn (any), Gt and Lt (one integer)."""


class NodeSelectorTerm(CRModel):
    """Requirements a node meets all of."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] | None = None
    """Requirements on the node's labels."""
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=16)] | None = None
    """Requirements on the node's fields (metadata.name)."""


class NodeSelector(CRModel):
    """Nodes that meet any one of the terms."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=16)]
    """The terms, OR-ed."""


class PreferredSchedulingTerm(CRModel):
    """A node preference and its weight."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight of the preference (1-100)."""
    preference: NodeSelectorTerm
    """Nodes preferred."""


class NodeAffinity(CRModel):
    """Which nodes slot pods run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes a slot pod must run on."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=16)] | None
    ) = None
    """Nodes a slot pod prefers, by weight."""


class PodAffinityTerm(CRModel):
    """Pods (by label, in namespaces) whose topology domain a slot pod joins or avoids."""

    label_selector: LabelSelector | None = None
    """The pods."""
    namespace_selector: LabelSelector | None = None
    """Namespaces of the pods (with namespaces; neither: the slot pod's own)."""
    namespaces: Annotated[list[DNSName], Field(max_length=64)] | None = None
    """Namespaces of the pods by name."""
    topology_key: LabelKey
    """The node label whose value is the domain, e.g. topology.kubernetes.io/zone."""
    match_label_keys: Annotated[list[LabelKey], Field(max_length=16)] | None = None
    """Keys of the slot pod's own labels added to the selector with its values."""
    mismatch_label_keys: Annotated[list[LabelKey], Field(max_length=16)] | None = None
    """Keys of the slot pod's own labels added to the selector against its values."""


class WeightedPodAffinityTerm(CRModel):
    """A pod affinity term and its weight."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight of the term (1-100)."""
    pod_affinity_term: PodAffinityTerm
    """The term."""


class PodAffinity(CRModel):
    """Pods a slot pod runs beside (affinity) or away from (anti-affinity)."""

    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=16)] | None
    ) = None
    """Terms that must hold."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=16)] | None
    ) = None
    """Terms preferred, by weight."""


class Affinity(CRModel):
    """Node affinity, pod affinity and pod anti-affinity of slot pods (as in core/v1)."""

    node_affinity: NodeAffinity | None = None
    """Which nodes."""
    pod_affinity: PodAffinity | None = None
    """Beside which pods."""
    pod_anti_affinity: PodAffinity | None = None
    """Away from which pods."""


class TopologySpreadConstraint(CRModel):
    """How slot pods spread across a topology (zones, nodes), as in core/v1."""

    max_skew: Annotated[int, Field(ge=1, le=1024)]
    """Most the number of matching pods may differ between two domains."""
    topology_key: LabelKey
    """The node label whose value is the domain."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """Keep the pod pending, or schedule it preferring less skew."""
    label_selector: LabelSelector | None = None
    """The pods counted (e.g. matchLabels llmbatch.io/pool: <pool>)."""
    min_domains: Annotated[int, Field(ge=1, le=1024)] | None = None
    """Fewest eligible domains (DoNotSchedule only)."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether the pod's node affinity limits the domains counted."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node taints limit the domains counted."""
    match_label_keys: Annotated[list[LabelKey], Field(max_length=16)] | None = None
    """Keys of the slot pod's own labels added to the selector with its values."""


class KeyToPath(CRModel):
    """One key of a Secret or ConfigMap projected to a file."""

    key: DNSName
    """The key."""
    path: Annotated[str, StringConstraints(max_length=253, pattern=r"^[^/]")]
    """Relative path of the file."""
    mode: Annotated[int, Field(ge=0, le=511)] | None = None
    """File mode bits (0-0777)."""


class ConfigMapVolume(CRModel):
    """A ConfigMap of the worker namespace as files."""

    name: DNSName
    """The ConfigMap."""
    items: Annotated[list[KeyToPath], Field(max_length=64)] | None = None
    """Keys to project; unset: every key as a file of its name."""
    default_mode: Annotated[int, Field(ge=0, le=511)] | None = None
    """Mode bits of the files (0-0777)."""
    optional: bool | None = None
    """Start the pod even when the ConfigMap is missing."""


class SecretVolume(CRModel):
    """A Secret of the worker namespace as files."""

    secret_name: DNSName
    """The Secret."""
    items: Annotated[list[KeyToPath], Field(max_length=64)] | None = None
    """Keys to project; unset: every key as a file of its name."""
    default_mode: Annotated[int, Field(ge=0, le=511)] | None = None
    """Mode bits of the files (0-0777)."""
    optional: bool | None = None
    """Start the pod even when the Secret is missing."""


class EmptyDirVolume(CRModel):
    """A scratch directory that lives as long as the pod."""

    medium: Literal["", "Memory"] | None = None
    """Memory for a tmpfs; empty: the node's disk."""
    size_limit: Quantity | None = None
    """Most bytes it may hold."""


class ClaimVolume(CRModel):
    """A PersistentVolumeClaim of the worker namespace."""

    claim_name: DNSName
    """The claim."""
    read_only: bool | None = None
    """Mount it read-only."""


class SecretReference(CRModel):
    """A Secret of the worker namespace by name."""

    name: DNSName
    """The Secret."""


class CSIVolume(CRModel):
    """A volume of a CSI driver (e.g. the Secrets Store CSI driver)."""

    driver: DNSName
    """The driver's name."""
    read_only: bool | None = None
    """Mount it read-only."""
    fs_type: ShortText | None = None
    """Filesystem type, where the driver takes one."""
    volume_attributes: (
        Annotated[
            dict[Annotated[str, StringConstraints(max_length=317)], ShortText], Field(max_length=32)
        ]
        | None
    ) = None
    """Driver-specific attributes."""
    node_publish_secret_ref: SecretReference | None = None
    """Secret the driver reads to publish the volume."""


class Volume(CRModel):
    """An extra volume of slot pods: exactly one source, of the kinds the restricted Pod
    Security Standard allows."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "[has(self.configMap), has(self.secret), has(self.emptyDir),"
                    " has(self.persistentVolumeClaim), has(self.csi)].filter(x, x).size() == 1",
                    "message": "exactly one of configMap, secret, emptyDir, persistentVolumeClaim"
                    " and csi",
                },
                {
                    "rule": "!(self.name in " + str(list(RESERVED_VOLUMES)) + ")",
                    "message": "tmp, model-cache and dshm are the operator's volumes",
                },
            ]
        }
    )

    name: DNSLabel
    """Name the mounts refer to."""
    config_map: ConfigMapVolume | None = None
    """A ConfigMap as files."""
    secret: SecretVolume | None = None
    """A Secret as files."""
    empty_dir: EmptyDirVolume | None = None
    """A scratch directory."""
    persistent_volume_claim: ClaimVolume | None = None
    """A PersistentVolumeClaim."""
    csi: CSIVolume | None = None
    """A CSI driver's volume."""


class VolumeMount(CRModel):
    """Where one of the template's volumes appears in the executor container."""

    name: DNSLabel
    """The volume (one of podTemplate.volumes)."""
    mount_path: AbsolutePath
    """Where it appears; the operator's own mounts (/tmp, /dev/shm, the model cache) win."""
    sub_path: ShortText | None = None
    """A path inside the volume to mount instead of its root."""
    read_only: bool | None = None
    """Mount it read-only."""


class PodMetadata(CRModel):
    """Labels and annotations of slot Jobs and their pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _qualified_keys("labels"),
                _qualified_keys("annotations"),
            ]
        }
    )

    labels: (
        Annotated[
            dict[Annotated[str, StringConstraints(max_length=317)], LabelValue],
            Field(max_length=32),
        ]
        | None
    ) = None
    """Labels of the slot Job and its pod, e.g. kueue.x-k8s.io/queue-name; the operator's own
    (llmbatch.io/*, app.kubernetes.io/*) win."""
    annotations: (
        Annotated[
            dict[
                Annotated[str, StringConstraints(max_length=317)],
                Annotated[str, StringConstraints(max_length=4096)],
            ],
            Field(max_length=32),
        ]
        | None
    ) = None
    """Annotations of the slot Job and its pod; the operator's own (llmbatch.io/*) win."""


class PodTemplate(CRModel):
    """Fields of slot pods the pool shapes, merged under the ones the operator owns: its labels,
    the executor's command, arguments, resources, security context and its own volumes and
    variables always win (docs/install.md#shaping-slot-pods)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.volumeMounts) || self.volumeMounts.all(m,"
                    " has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
                    "message": "every volumeMount names one of podTemplate.volumes",
                },
                _qualified_keys("nodeSelector"),
            ]
        }
    )

    metadata: PodMetadata | None = None
    """Labels and annotations of the slot Job and its pod."""
    node_selector: (
        Annotated[
            dict[Annotated[str, StringConstraints(max_length=317)], LabelValue],
            Field(max_length=32),
        ]
        | None
    ) = None
    """Node labels slot pods must match, added to spec.nodeSelector (which wins on a key)."""
    affinity: Affinity | None = None
    """Node and pod affinity of slot pods."""
    tolerations: Annotated[list[Toleration], Field(max_length=16)] | None = None
    """Tolerations added to spec.tolerations."""
    topology_spread_constraints: (
        Annotated[list[TopologySpreadConstraint], Field(max_length=8)] | None
    ) = None
    """How slot pods spread across zones or nodes."""
    priority_class_name: DNSName | None = None
    """PriorityClass of slot pods, instead of the operator's tier class."""
    volumes: Annotated[list[Volume], Field(max_length=16)] | None = None
    """Extra volumes of slot pods."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=16)] | None = None
    """Where the extra volumes appear in the executor container."""
