"""The operator's side of credit accounts: reserve at acceptance, settle at the end, repair.

Every change is read → ``core.billing`` → write back with the resourceVersion read; a 409 starts
over from a fresh read, so the gateway's and the operator's concurrent updates never overwrite
each other. Settlement removes the batch's reservation and adds its charge in one write, and a
batch without a reservation is never charged: finalisation running twice charges once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from llmbatch.api.resources import (
    CREDIT_ACCOUNT_NAME,
    CreditAccountSpec,
    CreditAccountStatus,
    CreditReservation,
)
from llmbatch.controller import metrics
from llmbatch.controller.accountcache import AccountCache
from llmbatch.controller.kube import Kube
from llmbatch.core import billing
from llmbatch.core.lifecycle import TERMINAL
from llmbatch.kube import Contended, update_status

log = logging.getLogger(__name__)

PLURAL = "creditaccounts"
ATTEMPTS = 30
ORPHAN_GRACE_SECONDS = 300
"""A reservation whose Batch does not exist this long after it was made is dropped (the
gateway reserved and then died before creating the Batch)."""

Change = Callable[[str, CreditAccountStatus], CreditAccountStatus | None]


class CreditAccountBusy(Contended):
    """Too many concurrent writers; the caller's next reconcile retries."""


@dataclass(frozen=True)
class Hold:
    """A batch's reservation after a ledger call, and the credit that call itself reserved."""

    entry: CreditReservation
    """The reservation in force: its terms (mode, prices) are the batch's."""
    added: Decimal = Decimal(0)
    """Credit this call reserved (a new reservation or a top-up); 0 when it found it held."""


class CreditLedger:
    """Reads and atomically updates tenants' ``CreditAccount`` objects."""

    def __init__(
        self, kube: Kube, tenants: tuple[str, ...] = (), clock: Callable[[], float] = time.time
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.batches_of: Callable[[str], list[dict[str, Any]] | None] | None = None
        """The namespace's Batches as the operator's cache holds them; None when it cannot
        tell (not synced yet): then they are listed."""
        # The tenant label is only used when the set of tenants is fixed by configuration.
        self.labelled = frozenset(tenants)
        self.accounts = AccountCache()
        """Acceptance's first look at an account (fed by the operator's watch)."""

    def tenant_label(self, namespace: str) -> str:
        return namespace if namespace in self.labelled else ""

    async def _update(self, namespace: str, change: Change) -> CreditAccountStatus | None:
        """Apply ``change`` until the write sticks; None when there is no account or no change."""
        written: list[CreditAccountStatus] = []

        def on_account(account: dict[str, Any]) -> dict[str, Any] | None:
            spec = CreditAccountSpec.model_validate(account.get("spec") or {})
            status = CreditAccountStatus.model_validate(account.get("status") or {})
            updated = change(spec.limit, status)
            written[:] = [updated] if updated is not None else []
            return None if updated is None else updated.to_k8s()

        def read() -> Awaitable[dict[str, Any] | None]:
            return self.kube.get_custom(PLURAL, namespace, CREDIT_ACCOUNT_NAME)

        def write(body: dict[str, Any]) -> Awaitable[Any]:
            return self.kube.replace_custom_status(PLURAL, namespace, CREDIT_ACCOUNT_NAME, body)

        try:
            stored = await update_status(read, write, on_account)
        except Contended as exc:
            raise CreditAccountBusy(f"credit account of {namespace}: {exc}") from exc
        return written[0] if stored is not None and written else None

    async def account(self, namespace: str) -> tuple[CreditAccountSpec, CreditAccountStatus] | None:
        """The namespace's account as the API server has it now."""
        account = await self.kube.get_custom(PLURAL, namespace, CREDIT_ACCOUNT_NAME)
        self.accounts.read(namespace, account)
        return _parsed(account)

    async def _first_look(
        self, namespace: str, *, trust_absence: bool = True
    ) -> tuple[CreditAccountSpec, CreditAccountStatus] | None:
        """The account as the watch last showed it (or a recent read found none, unless
        ``trust_absence`` is False), else read."""
        cached = self.accounts.look(namespace)
        if not cached.known or (cached.body is None and not trust_absence):
            return await self.account(namespace)
        return _parsed(cached.body)

    async def reserve(
        self, namespace: str, entry: CreditReservation, *, reserved_at_creation: bool = False
    ) -> Hold | None:
        """The reservation in force for ``entry.batch``: the one the gateway made at creation
        (its prices are the batch's), else ``entry`` once added. None: the tenant has no account.

        ``reserved_at_creation``: the gateway says it reserved, so the account exists even when
        a read a moment ago found none (the watch has not shown it yet): it is read.

        Raises ``billing.InsufficientCredit`` / ``billing.TooManyReservations``.
        """
        current = await self._first_look(namespace, trust_absence=not reserved_at_creation)
        if current is None:
            return None
        existing = billing.find(current[1], entry.batch)
        if existing is not None:
            return Hold(existing)
        currency = current[0].currency

        def add(limit: str, status: CreditAccountStatus) -> CreditAccountStatus | None:
            return billing.reserve(limit, currency, status, entry)

        written = await self._update(namespace, add)
        held = billing.find(written, entry.batch) if written is not None else None
        if held is not None:
            return Hold(held, Decimal(held.amount))
        # Nothing written: the account holds one for the batch already (the gateway's, made
        # after the look), or it is gone.
        again = await self.account(namespace)
        held = billing.find(again[1], entry.batch) if again is not None else None
        return None if held is None else Hold(held)

    async def top_up(self, namespace: str, wanted: CreditReservation) -> Hold | None:
        """Replace ``wanted.batch``'s reservation by ``wanted`` (see ``billing.top_up``).

        None when the batch holds no reservation. Raises ``billing.InsufficientCredit``.
        """
        current = await self.account(namespace)
        if current is None:
            return None
        currency = current[0].currency
        found: list[CreditReservation] = []  # the reservation the write that stuck replaced

        def raise_to(limit: str, status: CreditAccountStatus) -> CreditAccountStatus | None:
            held = billing.find(status, wanted.batch)
            found[:] = [held] if held is not None else []
            return billing.top_up(limit, currency, status, wanted)

        if await self._update(namespace, raise_to) is not None:
            increase = Decimal(wanted.amount) - Decimal(found[0].amount)
            return Hold(wanted, max(Decimal(0), increase))
        return Hold(found[0]) if found else None

    async def settle(self, namespace: str, batch: str, charge: str) -> bool:
        """Release ``batch``'s reservation and charge ``charge``; False when it held none."""

        def apply(limit: str, status: CreditAccountStatus) -> CreditAccountStatus | None:
            return billing.settle(limit, status, batch, charge)

        settled = await self._update(namespace, apply)
        if settled is None:
            return False
        metrics.CREDITS_CHARGED.labels(self.tenant_label(namespace)).inc(float(Decimal(charge)))
        log.info("credit of %s: batch %s charged %s", namespace, batch, charge)
        return True

    async def repair(self, namespace: str, body: dict[str, Any]) -> None:
        """Level-based upkeep of one account (a timer calls it).

        Drops reservations of Batches that no longer exist (older than the grace period) or that
        ended and were settled, and keeps reserved / available current after a limit change.
        The Batches come from the operator's cache when it has one (``batches_of``), else from
        one listing of the namespace; the account is written (read, then replaced) only when
        the listed one would change — with a deep backlog every reservation is old, and a pass
        cost a listing of every tenant's Batches and a read of every account each time.
        """
        now = int(self.clock())
        status = CreditAccountStatus.model_validate(body.get("status") or {})
        old = [
            e.batch for e in status.reservations or [] if now - e.created_at >= ORPHAN_GRACE_SECONDS
        ]
        orphans: set[str] = set()
        if old:  # one look at the namespace's Batches, not one GET per reservation
            batches = await self._batches(namespace)
            for name in old:
                batch = batches.get(name)
                batch_status = (batch or {}).get("status") or {}
                settled = ((batch_status.get("billing") or {}).get("settledAt")) is not None
                if batch is None or (batch_status.get("status") in TERMINAL and settled):
                    orphans.add(name)

        def tidy(limit: str, current: CreditAccountStatus) -> CreditAccountStatus | None:
            kept, dropped = billing.collect(limit, current, lambda e: e.batch not in orphans)
            if not dropped and kept.to_k8s() == current.to_k8s():
                return None
            for entry in dropped:
                log.warning(
                    "credit of %s: released orphaned reservation of %s", namespace, entry.batch
                )
            return kept

        limit = CreditAccountSpec.model_validate(body.get("spec") or {}).limit
        if tidy(limit, status) is not None:
            await self._update(namespace, tidy)

    async def _batches(self, namespace: str) -> dict[str | None, dict[str, Any]]:
        """The namespace's Batches by name: the operator's cache, else a listing."""
        listed = self.batches_of(namespace) if self.batches_of is not None else None
        if listed is None:
            listed = await self.kube.list_custom("batches", namespace)
        return {(b.get("metadata") or {}).get("name"): b for b in listed}

    async def run(self, namespaces: tuple[str, ...], interval: float) -> None:
        """Repair every account each ``interval`` seconds until cancelled.

        A plain task, not a kopf timer: a timer would put a finalizer on every CreditAccount,
        and tenants' namespaces must stay deletable while the operator is down.
        """
        while True:
            try:
                await self.repair_all(namespaces)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("credit account upkeep failed; retrying in %ss", interval)
            await asyncio.sleep(interval)

    async def repair_all(self, namespaces: tuple[str, ...]) -> None:
        """One upkeep pass; an account whose repair fails is logged and the pass goes on."""
        for namespace in namespaces or ("",):
            accounts = await self.kube.list_custom(PLURAL, namespace or None)
            for account in accounts:
                meta = account.get("metadata") or {}
                if meta.get("name") != CREDIT_ACCOUNT_NAME:
                    continue
                try:
                    await self.repair(meta["namespace"], account)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("credit account of %s: upkeep failed", meta.get("namespace"))


def _parsed(
    account: dict[str, Any] | None,
) -> tuple[CreditAccountSpec, CreditAccountStatus] | None:
    if account is None:
        return None
    return (
        CreditAccountSpec.model_validate(account.get("spec") or {}),
        CreditAccountStatus.model_validate(account.get("status") or {}),
    )
