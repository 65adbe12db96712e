"""Credit reservations at batch creation: atomic updates of the tenant's ``CreditAccount``.

Each update reads the account, applies ``core.billing`` to its status and writes the status back
with the resourceVersion it read; a concurrent writer makes the API server answer 409 and the
update starts over from a fresh read. So two creations racing for the last credit can never both
reserve it: one of them re-reads, sees too little left and answers 402.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from llmbatch.api.resources import (
    CREDIT_ACCOUNT_NAME,
    CreditAccountSpec,
    CreditAccountStatus,
    CreditReservation,
)
from llmbatch.core import billing
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.kube import Conflict, KubeAPI

PLURAL = "creditaccounts"
ATTEMPTS = 30


def _contended() -> APIError:
    return APIError(
        503,
        "The credit account is busy with concurrent updates; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
    )


async def _backoff(attempt: int) -> None:
    await asyncio.sleep(random.uniform(0, 0.01 * min(attempt + 1, 10)))


def _parts(account: dict[str, Any]) -> tuple[CreditAccountSpec, CreditAccountStatus]:
    return (
        CreditAccountSpec.model_validate(account.get("spec") or {}),
        CreditAccountStatus.model_validate(account.get("status") or {}),
    )


async def reserve_credit(kube: KubeAPI, namespace: str, entry: CreditReservation) -> bool:
    """Hold ``entry.amount`` for a batch about to be created.

    True when this call added the reservation; False when the tenant has no account (unlimited)
    or the batch holds a reservation already. 402 ``insufficient_credit`` when the credit left
    does not cover it, 429 when the account holds credit for too many unfinished batches.
    """
    for attempt in range(ATTEMPTS):
        account = await kube.get(PLURAL, namespace, CREDIT_ACCOUNT_NAME)
        if account is None:
            return False
        spec, status = _parts(account)
        try:
            updated = billing.reserve(spec.limit, spec.currency, status, entry)
        except billing.InsufficientCredit as exc:
            raise APIError(
                402, str(exc), type="insufficient_quota", code="insufficient_credit"
            ) from exc
        except billing.TooManyReservations as exc:
            raise APIError(
                429,
                str(exc),
                type="rate_limit_error",
                code="too_many_batches",
                headers={"Retry-After": "60"},
            ) from exc
        if updated is None:
            return False
        try:
            written = await kube.replace_status(
                PLURAL, namespace, CREDIT_ACCOUNT_NAME, {**account, "status": updated.to_k8s()}
            )
        except Conflict:
            await _backoff(attempt)
            continue
        return written is not None
    raise _contended()


async def release_credit(kube: KubeAPI, namespace: str, batch: str) -> None:
    """Give back the reservation of a batch that was not created after all (nothing charged)."""
    for attempt in range(ATTEMPTS):
        account = await kube.get(PLURAL, namespace, CREDIT_ACCOUNT_NAME)
        if account is None:
            return
        spec, status = _parts(account)
        updated = billing.settle(spec.limit, status, batch, "0")
        if updated is None:
            return
        try:
            await kube.replace_status(
                PLURAL, namespace, CREDIT_ACCOUNT_NAME, {**account, "status": updated.to_k8s()}
            )
        except Conflict:
            await _backoff(attempt)
            continue
        return
    raise _contended()
