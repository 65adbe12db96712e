"""Each pool's tenants as the operator keeps and shows them: their remembered use (decayed
seat-seconds, ``core.fairshare.Usage``) and the pool status's bounded list of seats against
fair share.

The use is advanced at every full round with the seats each tenant ran on since the last one
(piecewise constant between rounds, which run at least every ``QUIET_SECONDS``). It lives in
memory and in the pool's status (``status.fairSharing``: at most :data:`STATUS_TENANTS`
tenants, the busiest); a restarted operator resumes from the status, decayed over the time it
was away. A tenant beyond the listed ones loses its memory across a restart, which only ever
favours it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from llmbatch.core.fairshare import Usage, fair_seats
from llmbatch.core.scheduling import QueuedShard, Shares
from llmbatch.core.slots import Placement

#: Tenants listed in a pool's status (the CRD bounds the list to this).
STATUS_TENANTS = 20


class TenantLedger:
    """The remembered use of every pool's tenants, and the seats they ran on at its last
    round."""

    def __init__(self) -> None:
        self._usage: dict[str, Usage] = {}
        self._running: dict[str, Counter[str]] = {}

    def resume(self, pool: str, status: Mapping[str, Any], half_life: float) -> None:
        """Start pool ``pool``'s memory from its status (after a restart), unless kept."""
        if pool in self._usage:
            return
        fair = status.get("fairSharing") or {}
        at = fair.get("usageAt")
        if at is None:
            return
        used = {
            str(t["namespace"]): float(t.get("usageSeatSeconds") or 0)
            for t in fair.get("tenants") or []
            if t.get("namespace")
        }
        self._usage[pool] = Usage(float(half_life), float(at), used)

    def advance(self, pool: str, half_life: float, running: Counter[str], now: float) -> Usage:
        """The pool's use at ``now``: the tenants ran on the seats of the last round since it;
        ``running`` are the seats they run on now (for the next round)."""
        previous = self._usage.get(pool) or Usage(float(half_life), now)
        if previous.half_life != half_life:  # the pool's setting changed: keep what was used
            previous = Usage(float(half_life), previous.at, previous.seat_seconds)
        usage = previous.advance(self._running.get(pool, Counter()), now)
        self._usage[pool] = usage
        self._running[pool] = running
        return usage

    def forget(self, pool: str) -> None:
        self._usage.pop(pool, None)
        self._running.pop(pool, None)


def tenant_status(
    shares: Shares, usage: Usage, waiting: list[QueuedShard], total_seats: int
) -> dict[str, Any]:
    """The pool status's ``fairSharing``: tenants with work or remembered use, the most seats
    first, then the most use (at most :data:`STATUS_TENANTS`)."""
    share = fair_seats(dict(shares.weights), total_seats)
    waits = Counter(q.tenant for q in waiting)
    tenants = set(shares.weights) | set(usage.seat_seconds)
    used = usage.seat_seconds
    listed = sorted(
        tenants, key=lambda t: (-shares.seats.get(t, 0), -used.get(t, 0.0), -waits[t], t)
    )
    return {
        "activeTenants": len(shares.weights),
        "usageAt": int(usage.at),
        "tenants": [
            {
                "namespace": tenant,
                "seats": shares.seats.get(tenant, 0),
                "share": f"{share.get(tenant, 0.0):.2f}",
                "weight": f"{shares.weight(tenant):g}",
                "waiting": waits[tenant],
                "usageSeatSeconds": round(used.get(tenant, 0.0)),
            }
            for tenant in listed[:STATUS_TENANTS]
        ],
    }


def placed_status(
    shares: Shares, usage: Usage, placement: Placement, total_seats: int
) -> dict[str, Any]:
    """:func:`tenant_status` after a round's placement: the seats it granted count, what it
    left waiting (capped shards too) waits."""
    granted = [q for q, _ in placement.assign] + [q for g in placement.new_slots for q in g]
    seats = Counter(shares.seats) + Counter(q.tenant for q in granted)
    waiting = placement.waiting + placement.capped
    return tenant_status(replace(shares, seats=seats), usage, waiting, total_seats)
