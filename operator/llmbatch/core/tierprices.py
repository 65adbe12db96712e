"""The order of a pool's tier prices that the product documents promise, and the pool condition
that reports a pool breaking it.

Seed 004: expedited is "billed at the online rate with no batch discount"; seed 002: flex is the
"lowest price". So on a token-billed (catalog) pool, per input and per output token,
``expedited >= standard >= flex`` in one currency. A GPUTime pool charges GPU time, not its tier
prices, so it has no order to keep; a pool with ``expeditedAllowed: false`` never charges its
expedited price, so only ``standard >= flex`` applies.

A pool that breaks the order is **warned about, not refused**: its ``TierPricesOrdered``
condition turns False with the reason and a Warning Event is posted, while its batches keep
running at the prices it states (the prices fixed on each accepted batch never change). Refusing
the pool would take the model out of service for every tenant over a pricing typo, and a pool
that was applied before this rule must keep serving the batches it accepted.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from llmbatch.api.resources import BatchPoolSpec, Pricing
from llmbatch.core.lifecycle import set_condition

CONDITION = "TierPricesOrdered"
"""The BatchPool condition: True when the tier prices keep the documents' order."""
REASON_ORDERED = "TierPricesOrdered"
REASON_OUT_OF_ORDER = "TierPricesOutOfOrder"
REASON_NOT_TOKEN_BILLED = "GPUTimeBilling"

_ORDER = (("expedited", "standard"), ("standard", "flex"))
_WHY = {
    ("expedited", "standard"): "expedited is billed at the online rate, with no batch discount",
    ("standard", "flex"): "flex is the lowest price",
}


def price_order_problems(pool: BatchPoolSpec) -> list[str]:
    """Each way the pool's tier prices break ``expedited >= standard >= flex`` (one sentence
    each); empty when they keep it or the pool is billed by GPU time."""
    if pool.billing.mode != "Tokens":
        return []
    prices: dict[str, Pricing] = {
        tier: getattr(pool.tiers, tier).pricing for tier in ("expedited", "standard", "flex")
    }
    currencies = {p.currency for p in prices.values()}
    if len(currencies) > 1:
        listed = ", ".join(f"{tier} {p.currency}" for tier, p in prices.items())
        return [f"The tiers are priced in different currencies ({listed})."]
    problems: list[str] = []
    for higher, lower in _ORDER:
        if higher == "expedited" and not pool.expedited_allowed:
            continue  # the tier is not offered: its price is never charged
        for side in ("input", "output"):
            high = Decimal(getattr(prices[higher], f"{side}_per_million"))
            low = Decimal(getattr(prices[lower], f"{side}_per_million"))
            if high < low:
                problems.append(
                    f"tiers.{higher} {side}PerMillion {high} is below tiers.{lower}'s {low}, "
                    f"but {_WHY[(higher, lower)]}."
                )
    return problems


def price_verdict(pool: BatchPoolSpec) -> tuple[str, str, str]:
    """``(status, reason, message)`` of the pool's ``TierPricesOrdered`` condition."""
    problems = price_order_problems(pool)
    if problems:
        return "False", REASON_OUT_OF_ORDER, " ".join(problems)
    if pool.billing.mode != "Tokens":
        return "True", REASON_NOT_TOKEN_BILLED, "GPUTime pool: tier prices are not charged."
    return "True", REASON_ORDERED, "expedited >= standard >= flex, input and output."


def price_condition(
    pool: BatchPoolSpec, conditions: list[dict[str, Any]] | None, now: float
) -> tuple[list[dict[str, Any]] | None, tuple[str, str, str] | None]:
    """``(conditions, event)``: the pool's conditions with ``TierPricesOrdered`` set (None when
    they already say it), and the ``(type, reason, message)`` Event of a change (None when the
    condition is new and True, or did not change)."""
    status, reason, message = price_verdict(pool)
    old = next((c for c in conditions or [] if c.get("type") == CONDITION), None)
    if old is not None and (old.get("status"), old.get("reason"), old.get("message")) == (
        status,
        reason,
        message,
    ):
        return None, None
    updated = set_condition(conditions, CONDITION, status == "True", reason, message, now)
    if status == "False":
        return updated, ("Warning", REASON_OUT_OF_ORDER, message)
    if old is not None and old.get("status") == "False":
        return updated, ("Normal", REASON_ORDERED, "The tier prices keep their order again.")
    return updated, None
