"""Acceptance's first look at a tenant's CreditAccount comes from the watch (#30): no GET per
accepted batch, while every change of an account is still read and written with its
resourceVersion, so a stale look never reserves twice or lets a limit be passed."""

from __future__ import annotations

import asyncio
import copy
from decimal import Decimal
from typing import Any

import pytest

from llmbatch.api.resources import CreditReservation, Pricing
from llmbatch.controller.accountcache import ABSENT_TTL, AccountCache
from llmbatch.controller.credits import CreditLedger
from llmbatch.core import billing
from tests.fixtures.fakekube import FakeKube

NS = "team-a"
KEY = ("creditaccounts", NS, "default")


def reservation(batch: str, amount: str = "1") -> CreditReservation:
    return CreditReservation(
        batch=batch,
        amount=amount,
        created_at=1_800_000_000,
        pricing=Pricing(input_per_million="1", output_per_million="2"),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ledger_over(kube: FakeKube) -> tuple[CreditLedger, list[str], Clock]:
    """A ledger whose account cache runs on a fake clock, and the account GETs it makes."""
    ledger = CreditLedger(kube)  # type: ignore[arg-type]
    clock = Clock()
    ledger.accounts = AccountCache(clock)
    gets: list[str] = []
    original = kube.get_custom

    async def counted(plural: str, namespace: str | None, name: str) -> Any:
        if plural == "creditaccounts":
            gets.append(str(namespace))
        return await original(plural, namespace, name)

    kube.get_custom = counted  # type: ignore[method-assign]
    return ledger, gets, clock


def add_account(kube: FakeKube, limit: str = "10") -> dict[str, Any]:
    return kube.add(
        "creditaccounts",
        {"metadata": {"name": "default", "namespace": NS}, "spec": {"limit": limit}},
    )


def test_a_tenant_without_an_account_costs_one_read_per_ttl_not_one_per_batch() -> None:
    kube = FakeKube()
    ledger, gets, clock = ledger_over(kube)
    for i in range(20):
        assert asyncio.run(ledger.reserve(NS, reservation(f"batch-{i}"))) is None
    assert gets == [NS]
    clock.now += ABSENT_TTL + 0.1
    assert asyncio.run(ledger.reserve(NS, reservation("batch-late"))) is None
    assert gets == [NS, NS]


def test_an_account_the_watch_shows_counts_at_once_despite_a_recent_read_of_none() -> None:
    kube = FakeKube()
    ledger, gets, _ = ledger_over(kube)
    assert asyncio.run(ledger.reserve(NS, reservation("batch-before"))) is None
    assert gets == [NS]
    created = add_account(kube, "1")
    ledger.accounts.notice(copy.deepcopy(created))
    held = asyncio.run(ledger.reserve(NS, reservation("batch-after")))
    assert held is not None
    assert held.added == Decimal(1)
    with pytest.raises(billing.InsufficientCredit):  # the limit is read, never cached
        asyncio.run(ledger.reserve(NS, reservation("batch-over")))
    assert kube.objects[KEY]["status"]["reserved"] == "1.000000"


def test_a_reservation_in_the_watched_account_costs_no_read() -> None:
    kube = FakeKube()
    add_account(kube)
    ledger, gets, _ = ledger_over(kube)
    first = asyncio.run(ledger.reserve(NS, reservation("batch-a")))  # the gateway's, say
    assert first is not None
    ledger.accounts.notice(copy.deepcopy(kube.objects[KEY]))
    gets.clear()
    again = asyncio.run(ledger.reserve(NS, reservation("batch-a", "3")))
    assert again is not None
    assert (again.entry, again.added) == (first.entry, 0)
    assert gets == []


def test_a_stale_look_never_reserves_twice() -> None:
    """The watch shows the account before the gateway's reservation: the write path reads the
    account afresh, finds the reservation and keeps it (nothing added, nothing charged twice)."""
    kube = FakeKube()
    ledger, _, _ = ledger_over(kube)
    ledger.accounts.notice(copy.deepcopy(add_account(kube)))
    gateway = CreditLedger(kube)  # type: ignore[arg-type]
    made = asyncio.run(gateway.reserve(NS, reservation("batch-a")))
    assert made is not None
    held = asyncio.run(ledger.reserve(NS, reservation("batch-a", "3")))
    assert held is not None
    assert (held.entry, held.added) == (made.entry, 0)
    assert kube.objects[KEY]["status"]["reserved"] == "1.000000"


def test_the_cache_keeps_the_newest_version_and_forgets_a_deleted_account() -> None:
    clock = Clock()
    cache = AccountCache(clock)
    newer = {"metadata": {"name": "default", "namespace": NS, "resourceVersion": "7"}}
    older = {"metadata": {"name": "default", "namespace": NS, "resourceVersion": "5"}}
    cache.notice(newer)
    cache.notice(older)
    assert cache.look(NS).body is newer
    cache.notice({"metadata": {"name": "other", "namespace": NS, "resourceVersion": "9"}})
    assert cache.look(NS).body is newer  # only the account named default is the tenant's
    cache.notice(newer, deleted=True)
    look = cache.look(NS)
    assert look.known
    assert look.body is None
    clock.now += ABSENT_TTL
    assert not cache.look(NS).known
