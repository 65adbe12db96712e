"""The operator's credit ledger over the shared in-memory API: reservations, conflict retries,
orphan repair (settlement through the reconciler: tests/unit/test_reconciler_credit.py)."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from typing import Any

import pytest

from llmbatch.api.resources import CreditReservation, Pricing
from llmbatch.controller.credits import ORPHAN_GRACE_SECONDS, CreditLedger
from llmbatch.core import billing
from tests.fixtures.fakekube import FakeKube

NS = "team-a"
NOW = 1_800_000_000


def account(kube: FakeKube, limit: str = "10") -> None:
    kube.add(
        "creditaccounts",
        {"metadata": {"name": "default", "namespace": NS}, "spec": {"limit": limit}},
    )


def status_of(kube: FakeKube) -> dict[str, Any]:
    status: dict[str, Any] = kube.objects[("creditaccounts", NS, "default")].get("status", {})
    return status


def reservation(batch: str, amount: str, created_at: int = NOW) -> CreditReservation:
    return CreditReservation(
        batch=batch,
        amount=amount,
        created_at=created_at,
        pricing=Pricing(input_per_million="1", output_per_million="2"),
    )


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_reserve_keeps_the_gateways_reservation_and_its_prices() -> None:
    kube = FakeKube()
    account(kube)
    ledger = CreditLedger(kube)  # type: ignore[arg-type]
    first = run(ledger.reserve(NS, reservation("batch-a", "1")))
    assert first is not None
    assert first.entry.amount == "1"
    assert first.added == Decimal(1)
    # the operator's own estimate at validation does not replace what the gateway fixed
    again = run(ledger.reserve(NS, reservation("batch-a", "3")))
    assert again is not None
    assert again.entry == first.entry
    assert again.added == 0
    assert status_of(kube)["reserved"] == "1.000000"
    assert run(CreditLedger(FakeKube()).reserve(NS, reservation("b", "1"))) is None  # type: ignore[arg-type]


def test_reserve_refuses_beyond_the_limit() -> None:
    kube = FakeKube()
    account(kube, "1")
    ledger = CreditLedger(kube)  # type: ignore[arg-type]
    with pytest.raises(billing.InsufficientCredit):
        run(ledger.reserve(NS, reservation("batch-a", "1.5")))
    assert status_of(kube) == {}


def test_conflicting_writers_both_land() -> None:
    kube = FakeKube()
    account(kube)
    ledger = CreditLedger(kube)  # type: ignore[arg-type]

    async def both() -> None:
        await asyncio.gather(
            *(ledger.reserve(NS, reservation(f"batch-{i}", "1")) for i in range(8))
        )

    original = kube.get_custom

    async def slow_get(plural: str, namespace: str | None, name: str) -> Any:
        obj = await original(plural, namespace, name)
        await asyncio.sleep(0)  # let the other writers read the same version
        return obj

    kube.get_custom = slow_get  # type: ignore[method-assign]
    run(both())
    status = status_of(kube)
    assert status["activeBatches"] == 8
    assert status["reserved"] == "8.000000"


def test_repair_drops_orphans_after_the_grace_period_only() -> None:
    kube = FakeKube()
    account(kube)
    ledger = CreditLedger(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    old = NOW - ORPHAN_GRACE_SECONDS - 1
    for entry in (
        reservation("batch-gone", "1", old),
        reservation("batch-young", "1", NOW - 5),
        reservation("batch-live", "1", old),
    ):
        run(ledger.reserve(NS, entry))
    kube.add("batches", {"metadata": {"name": "batch-live", "namespace": NS}})
    run(ledger.repair(NS, kube.objects[("creditaccounts", NS, "default")]))
    names = [e["batch"] for e in status_of(kube)["reservations"]]
    assert names == ["batch-young", "batch-live"]
    assert status_of(kube)["charged"] == "0.000000"


def test_repair_fills_in_a_new_accounts_status() -> None:
    kube = FakeKube()
    account(kube, "5")
    run(CreditLedger(kube).repair(NS, kube.objects[("creditaccounts", NS, "default")]))  # type: ignore[arg-type]
    assert status_of(kube)["available"] == "5.000000"
    writes = kube.writes
    run(CreditLedger(kube).repair(NS, kube.objects[("creditaccounts", NS, "default")]))  # type: ignore[arg-type]
    assert kube.writes == writes  # nothing changed, nothing written


def test_repair_reads_the_namespaces_batches_with_one_list() -> None:
    kube = FakeKube()
    account(kube)
    ledger = CreditLedger(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    old = NOW - ORPHAN_GRACE_SECONDS - 1
    for i in range(5):
        run(ledger.reserve(NS, reservation(f"batch-{i}", "1", old)))
        if i % 2:
            kube.add("batches", {"metadata": {"name": f"batch-{i}", "namespace": NS}})
    calls: list[str] = []
    get, listing = kube.get_custom, kube.list_custom

    async def counted_get(plural: str, namespace: str | None, name: str) -> Any:
        calls.append("get " + plural)
        return await get(plural, namespace, name)

    async def counted_list(plural: str, namespace: str | None = None) -> Any:
        calls.append("list " + plural)
        return await listing(plural, namespace)

    kube.get_custom = counted_get  # type: ignore[method-assign]
    kube.list_custom = counted_list  # type: ignore[method-assign]
    run(ledger.repair(NS, kube.objects[("creditaccounts", NS, "default")]))
    assert [e["batch"] for e in status_of(kube)["reservations"]] == ["batch-1", "batch-3"]
    assert calls.count("list batches") == 1
    assert "get batches" not in calls


def test_one_accounts_failing_repair_does_not_stop_the_pass(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kube = FakeKube()
    for namespace in ("team-a", "team-b", "team-c"):
        kube.add(
            "creditaccounts",
            {"metadata": {"name": "default", "namespace": namespace}, "spec": {"limit": "5"}},
        )
    ledger = CreditLedger(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    repair = ledger.repair

    async def failing_for_a(namespace: str, body: dict[str, Any]) -> None:
        if namespace == "team-a":
            raise RuntimeError("boom")
        await repair(namespace, body)

    ledger.repair = failing_for_a  # type: ignore[method-assign]
    run(ledger.repair_all(()))
    for namespace in ("team-b", "team-c"):
        status = kube.objects[("creditaccounts", namespace, "default")]["status"]
        assert status["available"] == "5.000000"
    assert "credit account of team-a: upkeep failed" in caplog.text
