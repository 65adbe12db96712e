"""The operator's credit ledger over an in-memory API: reservation at acceptance, settlement
exactly once when finalisation runs twice, conflict retries, orphan repair."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from llmbatch.api.resources import CreditReservation, Pricing
from llmbatch.controller.batches import BatchReconciler, Step
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.credits import ORPHAN_GRACE_SECONDS, CreditLedger
from llmbatch.controller.kube import Conflict
from llmbatch.core import billing

NS = "team-a"
NOW = 1_800_000_000


class MemoryKube:
    """get / list / status PUT with resourceVersion preconditions, like the API server."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.writes = 0

    def put(self, plural: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        meta.setdefault("resourceVersion", "1")
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = obj

    async def get_custom(
        self, plural: str, namespace: str | None, name: str
    ) -> dict[str, Any] | None:
        obj = self.objects.get((plural, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list_custom(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (p, ns, _), o in self.objects.items()
            if p == plural and (namespace is None or ns == namespace)
        ]

    async def replace_custom_status(
        self, plural: str, namespace: str, name: str, body: dict[str, Any]
    ) -> bool:
        obj = self.objects.get((plural, namespace, name))
        if obj is None:
            return False
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict(name)
        obj["status"] = copy.deepcopy(body["status"])
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        self.writes += 1
        return True


def account(kube: MemoryKube, limit: str = "10") -> None:
    kube.put(
        "creditaccounts",
        {"metadata": {"name": "default", "namespace": NS}, "spec": {"limit": limit}},
    )


def status_of(kube: MemoryKube) -> dict[str, Any]:
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
    kube = MemoryKube()
    account(kube)
    ledger = CreditLedger(kube)  # type: ignore[arg-type]
    first = run(ledger.reserve(NS, reservation("batch-a", "1")))
    assert first is not None
    assert first.amount == "1"
    # the operator's own estimate at validation does not replace what the gateway fixed
    again = run(ledger.reserve(NS, reservation("batch-a", "3")))
    assert again == first
    assert status_of(kube)["reserved"] == "1.000000"
    assert run(CreditLedger(MemoryKube()).reserve(NS, reservation("b", "1"))) is None  # type: ignore[arg-type]


def test_reserve_refuses_beyond_the_limit() -> None:
    kube = MemoryKube()
    account(kube, "1")
    ledger = CreditLedger(kube)  # type: ignore[arg-type]
    with pytest.raises(billing.InsufficientCredit):
        run(ledger.reserve(NS, reservation("batch-a", "1.5")))
    assert status_of(kube) == {}


def test_finalisation_running_twice_charges_once() -> None:
    kube = MemoryKube()
    account(kube)
    config = OperatorConfig(store_uri="file:///nowhere", executor_store_uri="file:///nowhere")
    reconciler = BatchReconciler(kube, store=None, config=config, clock=lambda: NOW)  # type: ignore[arg-type]
    run(reconciler.credits.reserve(NS, reservation("batch-a", "2")))
    meta = {"namespace": NS, "name": "batch-a", "uid": "u-1"}
    before = {"status": "finalizing", "billing": {"mode": "Tokens", "reserved": "2"}}
    for _ in range(2):  # the first status patch is lost: the second run sees the old status
        step = Step(status={"status": "cancelled", "cost": "0.75"})
        run(reconciler._settle(meta, before, step, NOW))
        assert step.status["billing"]["settledAt"] == NOW
    status = status_of(kube)
    assert status["charged"] == "0.750000"
    assert status["reserved"] == "0.000000"
    assert status["available"] == "9.250000"
    # once the settled status is on the batch, nothing is written at all
    writes = kube.writes
    settled = {**before, "billing": {**before["billing"], "settledAt": NOW}}
    run(reconciler._settle(meta, settled, Step(status={"status": "cancelled"}), NOW))
    assert kube.writes == writes


@pytest.mark.parametrize("phase", ["completed", "failed", "expired", "cancelled"])
def test_every_terminal_state_releases_the_reservation(phase: str) -> None:
    kube = MemoryKube()
    account(kube)
    config = OperatorConfig(store_uri="file:///nowhere", executor_store_uri="file:///nowhere")
    reconciler = BatchReconciler(kube, store=None, config=config, clock=lambda: NOW)  # type: ignore[arg-type]
    run(reconciler.credits.reserve(NS, reservation("batch-a", "2")))
    step = Step(status={"status": phase})  # no cost: nothing ran
    run(reconciler._settle({"namespace": NS, "name": "batch-a"}, {}, step, NOW))
    status = status_of(kube)
    assert (status["reserved"], status["charged"], status["activeBatches"]) == (
        "0.000000",
        "0.000000",
        0,
    )


def test_conflicting_writers_both_land() -> None:
    kube = MemoryKube()
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
    kube = MemoryKube()
    account(kube)
    ledger = CreditLedger(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    old = NOW - ORPHAN_GRACE_SECONDS - 1
    for entry in (
        reservation("batch-gone", "1", old),
        reservation("batch-young", "1", NOW - 5),
        reservation("batch-live", "1", old),
    ):
        run(ledger.reserve(NS, entry))
    kube.put("batches", {"metadata": {"name": "batch-live", "namespace": NS}})
    run(ledger.repair(NS, kube.objects[("creditaccounts", NS, "default")]))
    names = [e["batch"] for e in status_of(kube)["reservations"]]
    assert names == ["batch-young", "batch-live"]
    assert status_of(kube)["charged"] == "0.000000"


def test_repair_fills_in_a_new_accounts_status() -> None:
    kube = MemoryKube()
    account(kube, "5")
    run(CreditLedger(kube).repair(NS, kube.objects[("creditaccounts", NS, "default")]))  # type: ignore[arg-type]
    assert status_of(kube)["available"] == "5.000000"
    writes = kube.writes
    run(CreditLedger(kube).repair(NS, kube.objects[("creditaccounts", NS, "default")]))  # type: ignore[arg-type]
    assert kube.writes == writes  # nothing changed, nothing written
