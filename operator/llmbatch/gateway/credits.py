"""Credit reservations at batch creation: atomic updates of the tenant's ``CreditAccount``.

Each update reads the account, applies ``core.billing`` to its status and writes the status back
with the resourceVersion it read; a concurrent writer makes the API server answer 409 and the
update starts over from a fresh read. So two creations racing for the last credit can never both
reserve it: one of them re-reads, sees too little left and answers 402.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from llmbatch.api.resources import (
    CREDIT_ACCOUNT_NAME,
    CreditAccountSpec,
    CreditAccountStatus,
    CreditReservation,
)
from llmbatch.core import billing
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.kube import KubeAPI
from llmbatch.kube.status import Contended, StatusChange, update_status

PLURAL = "creditaccounts"


def _contended() -> APIError:
    return APIError(
        503,
        "The credit account is busy with concurrent updates; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
    )


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

    def add(account: dict[str, Any]) -> dict[str, Any] | None:
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
        return None if updated is None else updated.to_k8s()

    return await _update(kube, namespace, add) is not None


async def release_credit(kube: KubeAPI, namespace: str, batch: str) -> None:
    """Give back the reservation of a batch that was not created after all (nothing charged)."""

    def release(account: dict[str, Any]) -> dict[str, Any] | None:
        spec, status = _parts(account)
        updated = billing.settle(spec.limit, status, batch, "0")
        return None if updated is None else updated.to_k8s()

    await _update(kube, namespace, release)


async def _update(kube: KubeAPI, namespace: str, change: StatusChange) -> dict[str, Any] | None:
    """The tenant's account changed by ``change`` (``llmbatch.kube.update_status``)."""

    def read() -> Awaitable[dict[str, Any] | None]:
        return kube.get(PLURAL, namespace, CREDIT_ACCOUNT_NAME)

    def write(body: dict[str, Any]) -> Awaitable[Any]:
        return kube.replace_status(PLURAL, namespace, CREDIT_ACCOUNT_NAME, body)

    try:
        return await update_status(read, write, change)
    except Contended as exc:
        raise _contended() from exc
