"""Credit through the reconciler's public step: reservation at acceptance (top-ups of forged
sizes, counted once), settlement exactly once at every terminal state, even when a status patch
is lost or the operator restarts."""

from __future__ import annotations

import asyncio
import copy
import pathlib
from decimal import Decimal

import pytest

from llmbatch.api.resources import BatchPoolSpec, CreditReservation, Pricing
from llmbatch.controller import metrics
from llmbatch.controller.batches import BatchReconciler
from llmbatch.controller.credits import CreditLedger
from llmbatch.core import billing
from tests.fixtures.builders import TENANT, make_batch, make_input_file, make_pool
from tests.fixtures.reconciler import ReconcilerHarness

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"
PRICED = {
    "standard": {
        "drainTargetSeconds": 60,
        "pricing": {"inputPerMillion": "1", "outputPerMillion": "2"},
    }
}


@pytest.fixture
def h(tmp_path: pathlib.Path) -> ReconcilerHarness:
    harness = ReconcilerHarness(tmp_path)
    harness.kube.add("batchpools", make_pool(tiers=PRICED))
    return harness


def account(h: ReconcilerHarness, limit: str = "10") -> None:
    h.kube.add(
        "creditaccounts",
        {"metadata": {"name": "default", "namespace": TENANT}, "spec": {"limit": limit}},
    )


def ledger(h: ReconcilerHarness) -> dict[str, object]:
    obj = h.kube.get("creditaccounts", TENANT, "default")
    assert obj is not None
    status: dict[str, object] = obj.get("status") or {}
    return status


def reserved_metric() -> float:
    value = metrics.REGISTRY.get_sample_value("llmbatch_credits_reserved_total", {"tenant": ""})
    return value or 0.0


def gateway_hold(h: ReconcilerHarness, amount: str) -> None:
    """What the gateway reserved at creation from the sizes on the BatchFile."""
    entry = CreditReservation(
        batch=BATCH,
        amount=amount,
        created_at=int(h.now),
        pool="pool-a",
        pricing=Pricing(input_per_million="1", output_per_million="2"),
    )
    asyncio.run(h.reconciler.credits.reserve(TENANT, entry))


def estimate(h: ReconcilerHarness, requests: int) -> Decimal:
    """The operator's estimate for the validated input (8 output tokens declared per line)."""
    data = h.store.get(f"files/{TENANT}/{FILE}")
    pool = BatchPoolSpec.model_validate(make_pool(tiers=PRICED)["spec"])
    size = billing.BatchSize(
        input_bytes=len(data),
        requests=requests,
        output_token_limits=8 * requests,
        requests_without_output_limit=0,
    )
    return billing.estimate_batch(pool, pool.tiers.standard.pricing, size).amount


def test_acceptance_tops_up_a_reservation_made_from_forged_file_sizes(
    h: ReconcilerHarness,
) -> None:
    account(h)
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 400))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    gateway_hold(h, "0.000003")  # from a BatchFile claiming one tiny request
    before = reserved_metric()
    status = h.step_until(BATCH, "in_progress")
    wanted = billing.money(estimate(h, 400))
    assert status["billing"]["reserved"] == wanted
    assert ledger(h)["reserved"] == wanted
    assert reserved_metric() - before == pytest.approx(float(wanted) - 0.000003)
    assert status["pricing"]["inputPerMillion"] == "1"


def test_acceptance_fails_when_the_top_up_does_not_fit(h: ReconcilerHarness) -> None:
    account(h, limit="0.000010")
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 400))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    gateway_hold(h, "0.000003")
    status = h.step_until(BATCH, "failed")
    assert [e["code"] for e in status["errors"]] == ["insufficient_credit"]
    assert status["requestCounts"] == {"total": 400, "completed": 0, "failed": 400}
    assert ledger(h)["reserved"] == "0.000000"  # settling at failed released the hold


def test_the_operators_own_reservation_counts_once(h: ReconcilerHarness) -> None:
    account(h)
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 10))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    before = reserved_metric()
    h.step(BATCH)
    snapshot = copy.deepcopy(h.status(BATCH))
    h.step(BATCH)  # validation reserves
    h.batch(BATCH)["status"] = snapshot  # the status patch was lost: validation runs again
    h.now += 60
    status = h.step_until(BATCH, "in_progress")
    wanted = estimate(h, 10)
    assert status["billing"]["reserved"] == billing.money(wanted)
    assert reserved_metric() - before == pytest.approx(float(wanted))


def test_finalisation_running_twice_charges_once(h: ReconcilerHarness) -> None:
    account(h)
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 3))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    h.step_until(BATCH, "in_progress")
    h.step(BATCH)
    h.run_jobs()
    before = copy.deepcopy(h.status(BATCH))  # the next step folds the shards' end and finalises
    assert before["status"] == "in_progress"
    status = h.step_until(BATCH, "completed")
    cost = status["cost"]
    assert Decimal(cost) > 0
    assert ledger(h)["charged"] == billing.money(Decimal(cost))
    # The terminal status patch is lost and the operator restarts: finalisation runs again.
    h.batch(BATCH)["status"] = before
    h.reconciler = BatchReconciler(h.kube, h.store, h.config, clock=h.clock)
    status = h.step_until(BATCH, "completed")
    assert status["billing"]["settledAt"]
    assert ledger(h)["charged"] == billing.money(Decimal(cost))
    assert ledger(h)["reserved"] == "0.000000"


@pytest.mark.parametrize("phase", ["completed", "failed", "expired", "cancelled"])
def test_every_terminal_state_releases_the_reservation(h: ReconcilerHarness, phase: str) -> None:
    account(h)
    requests = 0 if phase == "failed" else 2
    h.kube.add("batchfiles", make_input_file(h.store, FILE, requests))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    gateway_hold(h, "2")
    if phase == "cancelled":
        h.step(BATCH)
        h.batch(BATCH)["spec"]["cancel"] = True
    elif phase == "expired":
        h.step_until(BATCH, "in_progress")
        h.now = h.status(BATCH)["expiresAt"] + 1
    elif phase == "completed":
        h.step_until(BATCH, "in_progress")
        h.step(BATCH)
        h.run_jobs()
    h.step_until(BATCH, phase)
    status = ledger(h)
    assert (status["reserved"], status["activeBatches"]) == ("0.000000", 0)
    if phase != "completed":
        assert status["charged"] == "0.000000"


def account_reads(h: ReconcilerHarness) -> int:
    return sum(1 for call in h.kube.calls if call[:2] == ("get", "creditaccounts"))


def test_a_tenant_without_an_account_costs_one_read_of_it_per_batch(
    h: ReconcilerHarness,
) -> None:
    # acceptance looks for the account; the end does not look again when acceptance recorded
    # none (it holds no reservation to release), and an account made meanwhile charges nothing
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 3))
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    h.step_until(BATCH, "in_progress")
    assert account_reads(h) == 1
    account(h)
    h.step(BATCH)
    h.run_jobs()
    status = h.step_until(BATCH, "completed")
    assert status["billing"]["settledAt"]
    assert "account" not in status["billing"]
    assert account_reads(h) == 1
    assert (ledger(h).get("charged") or "0") in ("0", "0.000000")


def test_a_batch_refused_at_validation_releases_the_gateways_hold(h: ReconcilerHarness) -> None:
    # no acceptance record: the end reads the account and gives back what the gateway held
    account(h)
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 0))  # an empty input is refused
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    gateway_hold(h, "2")
    assert ledger(h)["reserved"] != "0.000000"
    h.step_until(BATCH, "failed")
    status = ledger(h)
    assert (status["reserved"], status["activeBatches"], status["charged"]) == (
        "0.000000",
        0,
        "0.000000",
    )


def test_a_gateway_reservation_made_just_after_a_read_found_no_account_is_charged(
    h: ReconcilerHarness,
) -> None:
    """The operator accepted a batch of a tenant without an account (the absence is
    remembered for 10 s); the tenant then makes its account and the gateway reserves credit for
    a new batch at once, before the operator's watch shows the account. That batch's
    acceptance must find the gateway's reservation, and its end must charge it."""
    h.kube.add("batchfiles", make_input_file(h.store, FILE, 3))
    other = "batch-" + "f" * 24
    h.kube.add("batches", make_batch(other, input_file_id=FILE))
    h.step_until(other, "in_progress")  # a read found no account: remembered
    account(h)
    reserved = make_batch(BATCH, input_file_id=FILE)
    reserved["metadata"]["annotations"] = {billing.RESERVED_ANNOTATION: "true"}  # the gateway's
    h.kube.add("batches", reserved)
    gateway = CreditLedger(h.kube)  # type: ignore[arg-type]  # the gateway's own read and write
    entry = CreditReservation(
        batch=BATCH,
        amount="2",
        created_at=int(h.now),
        pool="pool-a",
        pricing=Pricing(input_per_million="1", output_per_million="2"),
    )
    assert asyncio.run(gateway.reserve(TENANT, entry)) is not None
    status = h.step_until(BATCH, "in_progress")
    assert status["billing"]["account"] == "default"
    assert Decimal(status["billing"]["reserved"]) >= Decimal("2")
    h.step(BATCH)
    h.run_jobs()
    status = h.step_until(BATCH, "completed")
    assert Decimal(status["cost"]) > 0
    assert ledger(h)["charged"] == billing.money(Decimal(status["cost"]))
    assert ledger(h)["reserved"] == "0.000000"
