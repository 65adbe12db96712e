"""The operator's credit ledger over an in-memory API: reservation at acceptance, settlement
exactly once when finalisation runs twice, conflict retries, orphan repair."""

from __future__ import annotations

import asyncio
import copy
from decimal import Decimal
from typing import Any

import pytest

from llmbatch.api.resources import BatchPoolSpec, CreditReservation, Pricing
from llmbatch.controller import metrics
from llmbatch.controller.batches import BatchReconciler, Step
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.credits import ORPHAN_GRACE_SECONDS, CreditLedger
from llmbatch.controller.kube import Conflict
from llmbatch.core import billing
from llmbatch.core.validation import ValidationResult

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
    assert first.entry.amount == "1"
    assert first.added == Decimal(1)
    # the operator's own estimate at validation does not replace what the gateway fixed
    again = run(ledger.reserve(NS, reservation("batch-a", "3")))
    assert again is not None
    assert again.entry == first.entry
    assert again.added == 0
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


def reserved_metric() -> float:
    value = metrics.REGISTRY.get_sample_value("llmbatch_credits_reserved_total", {"tenant": ""})
    return value or 0.0


def validated(requests: int, max_tokens: int) -> ValidationResult:
    """What validation counted: ``requests`` lines of 300 bytes, each with ``max_tokens``."""
    return ValidationResult(
        errors=[],
        error_count=0,
        request_count=requests,
        line_count=requests,
        total_bytes=300 * requests,
        model="llama",
        shards=[],
        declared_output_tokens=requests * max_tokens,
        aborted=False,
    )


POOL = BatchPoolSpec.model_validate(
    {
        "models": [{"name": "llama", "source": "/m"}],
        "tiers": {
            "standard": {
                "drainTargetSeconds": 60,
                "pricing": {"inputPerMillion": "1", "outputPerMillion": "2"},
            }
        },
    }
)


def reconciler_on(kube: MemoryKube) -> BatchReconciler:
    config = OperatorConfig(store_uri="file:///nowhere", executor_store_uri="file:///nowhere")
    return BatchReconciler(kube, store=None, config=config, clock=lambda: NOW)  # type: ignore[arg-type]


def test_acceptance_tops_up_a_reservation_made_from_forged_file_sizes() -> None:
    """The gateway reserved from a BatchFile claiming 1 tiny request; validation counts 1,000
    requests of 300 bytes and 1,000 output tokens each: the hold is raised to their estimate,
    once, and only the raise counts as reserved by the operator."""
    kube = MemoryKube()
    account(kube)
    reconciler = reconciler_on(kube)
    gateways = reservation("batch-a", "0.000003").model_copy(update={"pool": "pool-a"})
    run(reconciler.credits.reserve(NS, gateways))
    meta = {"namespace": NS, "name": "batch-a"}
    before = reserved_metric()
    verdict = validated(1000, 1000)
    for _ in range(2):  # the first status patch is lost: validation runs again
        pricing, charges = run(reconciler._reserve(meta, "pool-a", POOL, {}, "standard", verdict))
        # 100,000 input tokens at 1 + 1,000,000 output tokens at 2, per 1M
        assert charges["reserved"] == "2.100000"
        assert charges["estimatedTokens"] == 1_100_000
        assert pricing["inputPerMillion"] == "1"
    assert status_of(kube)["reserved"] == "2.100000"
    assert reserved_metric() - before == pytest.approx(2.1 - 0.000003)


def test_acceptance_fails_when_the_top_up_does_not_fit() -> None:
    kube = MemoryKube()
    account(kube, "1")
    reconciler = reconciler_on(kube)
    gateways = reservation("batch-a", "0.000003").model_copy(update={"pool": "pool-a"})
    run(reconciler.credits.reserve(NS, gateways))
    with pytest.raises(billing.InsufficientCredit):
        run(
            reconciler._reserve(
                {"namespace": NS, "name": "batch-a"},
                "pool-a",
                POOL,
                {},
                "standard",
                validated(1000, 1000),
            )
        )
    assert status_of(kube)["reserved"] == "0.000003"  # the batch fails; settling releases it


def test_the_operators_own_reservation_counts_once() -> None:
    kube = MemoryKube()
    account(kube)
    reconciler = reconciler_on(kube)
    before = reserved_metric()
    for _ in range(2):
        run(
            reconciler._reserve(
                {"namespace": NS, "name": "batch-k"},
                "pool-a",
                POOL,
                {},
                "standard",
                validated(10, 100),
            )
        )
    # 1,000 input tokens at 1 + 1,000 output tokens at 2, per 1M
    assert status_of(kube)["reserved"] == "0.003000"
    assert reserved_metric() - before == pytest.approx(0.003)


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


def test_repair_reads_the_namespaces_batches_with_one_list() -> None:
    kube = MemoryKube()
    account(kube)
    ledger = CreditLedger(kube, clock=lambda: NOW)  # type: ignore[arg-type]
    old = NOW - ORPHAN_GRACE_SECONDS - 1
    for i in range(5):
        run(ledger.reserve(NS, reservation(f"batch-{i}", "1", old)))
        if i % 2:
            kube.put("batches", {"metadata": {"name": f"batch-{i}", "namespace": NS}})
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
    kube = MemoryKube()
    for namespace in ("team-a", "team-b", "team-c"):
        kube.put(
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
