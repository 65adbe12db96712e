"""The registry of kinds: what ``hack/gen_crds.py`` needs to know to write each CRD."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from llmbatch.api.resources.base import CRModel
from llmbatch.api.resources.batch import BatchSpec, BatchStatus
from llmbatch.api.resources.batchfile import BatchFileSpec, BatchFileStatus
from llmbatch.api.resources.credit import (
    CREDIT_ACCOUNT_NAME,
    CreditAccountSpec,
    CreditAccountStatus,
)
from llmbatch.api.resources.pool import BatchPoolSpec, BatchPoolStatus
from llmbatch.api.resources.webhook import BatchWebhookSpec, BatchWebhookStatus


class ResourceKind(BaseModel):
    """What the generator needs to know about one kind."""

    kind: str
    plural: str
    singular: str
    short_names: list[str]
    scope: Literal["Namespaced", "Cluster"]
    spec: type[CRModel]
    status: type[CRModel]
    description: str
    printer_columns: list[dict[str, str]]
    rules: list[dict[str, str]] = []
    """CEL rules on the whole object (x-kubernetes-validations of the root schema)."""


RESOURCES: tuple[ResourceKind, ...] = (
    ResourceKind(
        kind="Batch",
        plural="batches",
        singular="batch",
        short_names=["lbatch"],
        scope="Namespaced",
        spec=BatchSpec,
        status=BatchStatus,
        description=(
            "An OpenAI-compatible batch of inference requests; its namespace is the tenant. "
            "When it ends, the condition Complete is True (status completed) or Failed is True "
            "(failed, expired or cancelled; the reason says which)."
        ),
        printer_columns=[
            {"name": "Status", "type": "string", "jsonPath": ".status.status"},
            {"name": "Completed", "type": "integer", "jsonPath": ".status.requestCounts.completed"},
            {"name": "Failed", "type": "integer", "jsonPath": ".status.requestCounts.failed"},
            {"name": "Total", "type": "integer", "jsonPath": ".status.requestCounts.total"},
            {"name": "Priority", "type": "string", "jsonPath": ".spec.priority"},
            {"name": "Pool", "type": "string", "jsonPath": ".status.pool"},
            {"name": "Model", "type": "string", "jsonPath": ".status.model", "priority": "1"},
            {"name": "Cost", "type": "string", "jsonPath": ".status.cost", "priority": "1"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        rules=[
            {
                "rule": "self.metadata.name.startsWith('batch-')",
                "message": "a Batch name starts with batch- (its OpenAI id is batch_<rest>)",
            }
        ],
    ),
    ResourceKind(
        kind="BatchFile",
        plural="batchfiles",
        singular="batchfile",
        short_names=["lbfile"],
        scope="Namespaced",
        spec=BatchFileSpec,
        status=BatchFileStatus,
        description="Metadata of a file in the object store (batch input, output or errors).",
        printer_columns=[
            {"name": "Purpose", "type": "string", "jsonPath": ".spec.purpose"},
            {"name": "Bytes", "type": "integer", "jsonPath": ".spec.bytes"},
            {"name": "Filename", "type": "string", "jsonPath": ".spec.filename"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    ),
    ResourceKind(
        kind="BatchPool",
        plural="batchpools",
        singular="batchpool",
        short_names=["lbpool"],
        scope="Cluster",
        spec=BatchPoolSpec,
        status=BatchPoolStatus,
        description="A pool of GPU slots serving one or more models to batches.",
        printer_columns=[
            {"name": "Model", "type": "string", "jsonPath": ".spec.models[0].name"},
            {"name": "Warm", "type": "integer", "jsonPath": ".status.warmSlots"},
            {"name": "Busy", "type": "integer", "jsonPath": ".status.slotsInUse"},
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredSlots"},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.maxSlots"},
            {"name": "Expedited", "type": "integer", "jsonPath": ".status.queueDepth.expedited"},
            {"name": "Standard", "type": "integer", "jsonPath": ".status.queueDepth.standard"},
            {"name": "Flex", "type": "integer", "jsonPath": ".status.queueDepth.flex"},
            {
                "name": "Tenants",
                "type": "integer",
                "jsonPath": ".status.fairSharing.activeTenants",
            },
            {
                "name": "Top",
                "type": "string",
                "jsonPath": ".status.fairSharing.tenants[0].namespace",
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        rules=[
            {
                "rule": (
                    "!has(self.spec.fairSharing) || !has(self.spec.fairSharing.preemption)"
                    " || self.spec.fairSharing.preemption == 'Never'"
                    " || (has(self.spec.slotQueue) && self.spec.slotQueue == 0)"
                ),
                "message": (
                    "fairSharing.preemption BelowGuarantee needs slotQueue: 0 (a seat a preempted "
                    "shard frees must go to the tenant below its guarantee, not to a slot's queue)"
                ),
            },
            {
                "rule": (
                    "!has(self.spec.fairSharing) || !has(self.spec.fairSharing.tenants)"
                    " || self.spec.fairSharing.tenants.all(t, !has(t.maxSeats)"
                    " || !has(t.minSeats) || t.minSeats <= t.maxSeats)"
                ),
                "message": "fairSharing.tenants: minSeats must not exceed maxSeats",
            },
        ],
    ),
    ResourceKind(
        kind="CreditAccount",
        plural="creditaccounts",
        singular="creditaccount",
        short_names=["lbcredit"],
        scope="Namespaced",
        spec=CreditAccountSpec,
        status=CreditAccountStatus,
        description=(
            "A tenant's credit: its limit, the credit reserved by unfinished batches and what "
            "finished batches were charged. One per tenant namespace, named default."
        ),
        printer_columns=[
            {"name": "Limit", "type": "string", "jsonPath": ".spec.limit"},
            {"name": "Reserved", "type": "string", "jsonPath": ".status.reserved"},
            {"name": "Charged", "type": "string", "jsonPath": ".status.charged"},
            {"name": "Available", "type": "string", "jsonPath": ".status.available"},
            {"name": "Batches", "type": "integer", "jsonPath": ".status.activeBatches"},
            {"name": "Currency", "type": "string", "jsonPath": ".spec.currency", "priority": "1"},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
        rules=[
            {
                "rule": f"self.metadata.name == '{CREDIT_ACCOUNT_NAME}'",
                "message": f"a tenant has one CreditAccount, named {CREDIT_ACCOUNT_NAME}",
            }
        ],
    ),
    ResourceKind(
        kind="BatchWebhook",
        plural="batchwebhooks",
        singular="batchwebhook",
        short_names=["lbhook"],
        scope="Namespaced",
        spec=BatchWebhookSpec,
        status=BatchWebhookStatus,
        description=(
            "An endpoint that receives a signed event (Standard Webhooks, OpenAI's event body) "
            "when a Batch of its namespace ends."
        ),
        printer_columns=[
            {"name": "URL", "type": "string", "jsonPath": ".spec.url"},
            {"name": "Delivered", "type": "integer", "jsonPath": ".status.delivered"},
            {"name": "Failed", "type": "integer", "jsonPath": ".status.failedAttempts"},
            {"name": "GivenUp", "type": "integer", "jsonPath": ".status.givenUp"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    ),
)
