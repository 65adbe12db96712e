"""Custom resources of group ``llmbatch.io/v1alpha1``: Batch, BatchFile, BatchPool, CreditAccount,
BatchWebhook.

These models are the single source of truth: ``hack/gen_crds.py`` turns them into the CRDs in
``crds/`` and the Helm chart, and every attribute docstring becomes the field's description that
``kubectl explain`` shows. Shape rules (checked by tests/unit/test_crd_shape.py): every string and
list is bounded, no floats (decimals are strings), no free-form maps except ``metadata``,
``nodeSelector`` and an inline request ``body``.

One module per kind (``batch``, ``batchfile``, ``pool``, ``credit``, ``webhook``), the field types
and base model they share (``fields``, ``base``) and the registry the generator reads
(``registry``); everything is importable from here.
"""

from __future__ import annotations

from llmbatch.api.resources.base import (
    API_VERSION,
    GROUP,
    VERSION,
    Condition,
    Conditions,
    CRModel,
    Pricing,
)
from llmbatch.api.resources.batch import (
    BATCH_FINALIZER,
    BatchBilling,
    BatchPhase,
    BatchSpec,
    BatchStatus,
    EndpointPath,
    InlineInputRef,
    InlineRequest,
    Phase,
    RequestCounts,
    ShardPlanRef,
    ShardStatus,
    SucceededShards,
    Usage,
    ValidationError,
)
from llmbatch.api.resources.batchfile import BatchFileSpec, BatchFileStatus, FileMedia
from llmbatch.api.resources.credit import (
    CREDIT_ACCOUNT_NAME,
    CreditAccountSpec,
    CreditAccountStatus,
    CreditReservation,
)
from llmbatch.api.resources.fields import (
    BillingMode,
    Decimal,
    DNSName,
    Label,
    ObjectID,
    Quantity,
    Sha256,
    ShortText,
    SignedDecimal,
    StoreKey,
    Text,
    Tier,
)
from llmbatch.api.resources.pool import (
    BatchPoolSpec,
    BatchPoolStatus,
    EnvVar,
    ExecutorSpec,
    LabelRequirement,
    ModelCache,
    NamespaceSelector,
    PoolBilling,
    PoolLimits,
    PoolModel,
    PoolRetention,
    PoolRetries,
    PoolTenants,
    PoolTiers,
    QueueDepth,
    TierSettings,
    Toleration,
)
from llmbatch.api.resources.registry import RESOURCES, ResourceKind
from llmbatch.api.resources.webhook import (
    BatchWebhookSpec,
    BatchWebhookStatus,
    SecretKeyRef,
    WebhookEventType,
    WebhookURL,
)

__all__ = [
    "API_VERSION",
    "BATCH_FINALIZER",
    "CREDIT_ACCOUNT_NAME",
    "GROUP",
    "RESOURCES",
    "VERSION",
    "BatchBilling",
    "BatchFileSpec",
    "BatchFileStatus",
    "BatchPhase",
    "BatchPoolSpec",
    "BatchPoolStatus",
    "BatchSpec",
    "BatchStatus",
    "BatchWebhookSpec",
    "BatchWebhookStatus",
    "BillingMode",
    "CRModel",
    "Condition",
    "Conditions",
    "CreditAccountSpec",
    "CreditAccountStatus",
    "CreditReservation",
    "DNSName",
    "Decimal",
    "EndpointPath",
    "EnvVar",
    "ExecutorSpec",
    "FileMedia",
    "InlineInputRef",
    "InlineRequest",
    "Label",
    "LabelRequirement",
    "ModelCache",
    "NamespaceSelector",
    "ObjectID",
    "Phase",
    "PoolBilling",
    "PoolLimits",
    "PoolModel",
    "PoolRetention",
    "PoolRetries",
    "PoolTenants",
    "PoolTiers",
    "Pricing",
    "Quantity",
    "QueueDepth",
    "RequestCounts",
    "ResourceKind",
    "SecretKeyRef",
    "Sha256",
    "ShardPlanRef",
    "ShardStatus",
    "ShortText",
    "SignedDecimal",
    "StoreKey",
    "SucceededShards",
    "Text",
    "Tier",
    "TierSettings",
    "Toleration",
    "Usage",
    "ValidationError",
    "WebhookEventType",
    "WebhookURL",
]
