"""Shared field types: bounded strings, decimals written as strings, tiers and billing modes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import StringConstraints

# Bounded string types (Kubernetes-style limits).
DNSName = Annotated[str, StringConstraints(max_length=253)]
Label = Annotated[str, StringConstraints(max_length=63)]
ShortText = Annotated[str, StringConstraints(max_length=256)]
Text = Annotated[str, StringConstraints(max_length=4096)]
ObjectID = Annotated[str, StringConstraints(max_length=128)]
StoreKey = Annotated[str, StringConstraints(max_length=1024)]
Decimal = Annotated[str, StringConstraints(max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?$")]
"""A non-negative decimal number written as a string (CRDs carry no floats)."""
SignedDecimal = Annotated[str, StringConstraints(max_length=33, pattern=r"^-?[0-9]+(\.[0-9]+)?$")]
"""A decimal number that may be negative, written as a string."""
Sha256 = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$")]
Quantity = Annotated[str, StringConstraints(max_length=64)]

Tier = Literal["expedited", "standard", "flex"]
"""Scheduling tier: expedited before standard before flex."""
BillingMode = Literal["Tokens", "GPUTime"]
"""Tokens: catalog pool, token prices per tier. GPUTime: private deployment, billed GPU time."""
