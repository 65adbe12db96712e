"""The CreditAccount resource: a tenant's credit limit, its reservations and its charges."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from llmbatch.api.resources.base import Conditions, CRModel, Pricing
from llmbatch.api.resources.fields import BillingMode, Decimal, DNSName, SignedDecimal

CREDIT_ACCOUNT_NAME = "default"
"""A tenant's one CreditAccount: ``creditaccounts/default`` in its namespace."""


class CreditAccountSpec(CRModel):
    """The credit a tenant may spend; raise the limit to top it up."""

    limit: Decimal
    """Total credit granted, in currency units; spending stops when reserved + charged reach it."""
    currency: Annotated[str, StringConstraints(max_length=8)] = "USD"
    """ISO currency code (the pools' prices are in this currency)."""


class CreditReservation(CRModel):
    """Credit held for one batch from acceptance until it ends."""

    batch: DNSName
    """Name of the Batch (in the account's namespace)."""
    amount: Decimal
    """Credit held: the estimated cost."""
    estimated_tokens: int = 0
    """Input plus output tokens the estimate assumed."""
    pool: DNSName | None = None
    """The pool whose prices were used."""
    mode: BillingMode = "Tokens"
    """How the batch will be charged."""
    pricing: Pricing | None = None
    """Token prices of the batch's tier, fixed at acceptance (Tokens mode)."""
    gpu_hour_price: Decimal | None = None
    """GPU-hour price fixed at acceptance (GPUTime mode)."""
    created_at: int
    """Unix seconds: when the credit was reserved."""


class CreditAccountStatus(CRModel):
    """Spend of the tenant, kept by the gateway and the operator with atomic updates."""

    reserved: Decimal = "0"
    """Credit held by unfinished batches (the sum of reservations)."""
    charged: Decimal = "0"
    """Credit spent by finished batches, ever."""
    available: SignedDecimal | None = None
    """limit - reserved - charged (negative when actual costs passed the estimates)."""
    active_batches: int = 0
    """Batches holding a reservation."""
    reservations: Annotated[list[CreditReservation], Field(max_length=1000)] | None = None
    """One entry per unfinished batch; a batch is charged once, when its entry is removed."""
    conditions: Conditions | None = None
    """Conditions."""
