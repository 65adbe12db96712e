"""Scheduling tiers: their order, the flex window and the namespace switch for expedited work.

One place for rules the gateway (admission, the OpenAI object it shows) and the operator
(acceptance, scheduling, Job priority classes) both apply.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmbatch.api.resources import MAX_COMPLETION_WINDOW, Tier
from llmbatch.core.lifecycle import window_seconds

TIERS: tuple[Tier, ...] = ("expedited", "standard", "flex")
"""Every tier, in the order the pool scheduler serves them."""
TIER_RANK: dict[str, int] = {tier: rank for rank, tier in enumerate(TIERS)}
"""Position of a tier in :data:`TIERS` (lower runs first)."""

FLEX_WINDOW = "72h"
"""Completion window of a flex batch that asked for the default 24 h."""
DEFAULT_WINDOW = "24h"

NAMESPACE_EXPEDITED_DISABLED = "llmbatch.io/expedited-disabled"
"""Namespace annotation: ``"true"`` refuses ``priority: expedited`` for that tenant."""


def tier_of(priority: str | None, metadata: Mapping[str, str] | None) -> Tier:
    """The tier of a batch: its ``priority``, or flex when ``metadata.tier`` says so."""
    if priority == "flex" or (metadata or {}).get("tier") == "flex":
        return "flex"
    return "expedited" if priority == "expedited" else "standard"


def completion_window(tier: Tier, requested: str) -> str:
    """The window a batch gets: flex turns the default 24 h into 72 h."""
    return FLEX_WINDOW if tier == "flex" and requested == DEFAULT_WINDOW else requested


def window_refusal(requested: str) -> str | None:
    """Why a batch may not ask for the completion window ``requested`` (not a duration, or
    longer than :data:`~llmbatch.api.resources.MAX_COMPLETION_WINDOW`); None when it may."""
    try:
        seconds = window_seconds(requested)
    except ValueError:
        return f"completionWindow {requested[:16]!r} is not a duration such as 24h, 90m or 3600s."
    if seconds > window_seconds(MAX_COMPLETION_WINDOW):
        return (
            f"completionWindow {requested} is longer than the longest window a batch may have, "
            f"{MAX_COMPLETION_WINDOW}."
        )
    return None


def expedited_disabled(namespace_annotations: Mapping[str, str]) -> bool:
    """Whether a tenant namespace refuses expedited batches."""
    return namespace_annotations.get(NAMESPACE_EXPEDITED_DISABLED, "").lower() == "true"
