"""Credit maths (llmbatch.core.billing): estimates, charges, the ledger, run-time tracking.

The worked examples are the ones docs/billing.md shows.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch.api.resources import (
    BatchPoolSpec,
    CreditAccountStatus,
    CreditReservation,
    Pricing,
)
from llmbatch.core import billing
from llmbatch.core.lifecycle import TERMINAL

STANDARD = Pricing(input_per_million="0.25", output_per_million="0.75")


def pool(**billing_fields: object) -> BatchPoolSpec:
    return BatchPoolSpec.model_validate(
        {
            "models": [{"name": "llama", "source": "/models/llama"}],
            "gpusPerSlot": 2,
            "throughputPerSlot": "0.5",
            "billing": billing_fields,
        }
    )


def entry(batch: str, amount: str, created_at: int = 1000) -> CreditReservation:
    return CreditReservation(batch=batch, amount=amount, created_at=created_at, pricing=STANDARD)


# --- estimates ---------------------------------------------------------------------------------


def test_worked_example_token_estimate() -> None:
    size = billing.BatchSize(
        input_bytes=600_000,
        requests=1000,
        output_token_limits=900 * 256,
        requests_without_output_limit=100,
    )
    estimate = billing.estimate_batch(pool(), STANDARD, size)
    assert estimate.input_tokens == 200_000
    assert estimate.output_tokens == 900 * 256 + 100 * 1024 == 332_800
    assert billing.money(estimate.amount) == "0.299600"
    assert estimate.tokens == 532_800


def test_input_estimate_rounds_up_and_default_output_is_the_pools() -> None:
    assert billing.estimate_input_tokens(0) == 0
    assert billing.estimate_input_tokens(1) == 1
    assert billing.estimate_input_tokens(3) == 1
    assert billing.estimate_input_tokens(4) == 2
    size = billing.BatchSize(10, 2, 0, 2)
    assert billing.estimate_output_tokens(size, 64) == 128
    estimate = billing.estimate_batch(pool(defaultOutputTokens=64), STANDARD, size)
    assert estimate.output_tokens == 128


def test_worked_example_gpu_time_estimate() -> None:
    private = pool(mode="GPUTime", gpuHourPrice="2.40")
    size = billing.BatchSize(50_000, 95, 95 * 256, 0)
    estimate = billing.estimate_batch(private, STANDARD, size)
    # ceil(95 / 0.5) slot-seconds on 2 GPUs at 2.40 per GPU-hour, rounded up, never below
    assert billing.money(estimate.amount) == "0.253334"
    # the learned throughput outranks the spec's: 95 slot-seconds on 2 GPUs
    faster = billing.estimate_batch(private, STANDARD, size, throughput_per_slot="1")
    assert billing.money(faster.amount) == "0.126667"


@given(
    st.integers(0, 10**9),
    st.integers(0, 50_000),
    st.integers(0, 10**8),
    st.integers(0, 50_000),
)
def test_estimate_never_below_the_cost_of_what_it_assumed(
    size_bytes: int, requests: int, declared: int, without: int
) -> None:
    size = billing.BatchSize(size_bytes, requests, declared, without)
    estimate = billing.estimate_batch(pool(), STANDARD, size)
    exact = billing.token_cost(estimate.input_tokens, estimate.output_tokens, STANDARD)
    assert estimate.amount >= exact
    assert estimate.amount - exact < Decimal("0.000001")


# --- charges -----------------------------------------------------------------------------------


def test_worked_example_cancelled_batch_charges_its_successes_only() -> None:
    # 600 requests succeeded before the cancel: 90,000 input and 120,000 output tokens in the
    # output file; failed and never-run requests have no usage there
    charge = billing.final_charge(
        "Tokens", pricing=STANDARD, input_tokens=90_000, output_tokens=120_000
    )
    assert charge == "0.112500"


def test_gpu_time_charge_ignores_tokens() -> None:
    charge = billing.final_charge(
        "GPUTime",
        pricing=STANDARD,
        input_tokens=10**9,
        output_tokens=10**9,
        gpu_seconds=300,
        gpu_hour_price="2.40",
    )
    assert charge == "0.200000"
    assert billing.final_charge("Tokens", pricing=None, input_tokens=5, output_tokens=5) == (
        "0.000000"
    )


# --- the ledger --------------------------------------------------------------------------------


def test_reserve_within_the_limit_and_refuse_beyond_it() -> None:
    status = CreditAccountStatus(charged="2.5")
    held = billing.reserve("10", "USD", status, entry("batch-a", "7.5"))
    assert held is not None
    assert (held.reserved, held.charged, held.available, held.active_batches) == (
        "7.500000",
        "2.500000",
        "0.000000",
        1,
    )
    with pytest.raises(billing.InsufficientCredit) as err:
        billing.reserve("10", "USD", held, entry("batch-b", "0.000001"))
    assert "0.000001 USD" in str(err.value)
    assert "0.000000 USD is available" in str(err.value)
    # a batch that costs nothing always fits, even on an exhausted account
    assert billing.reserve("10", "USD", held, entry("batch-free", "0")) is not None


def test_reserving_twice_for_one_batch_changes_nothing() -> None:
    held = billing.reserve("10", "USD", CreditAccountStatus(), entry("batch-a", "1"))
    assert held is not None
    assert billing.reserve("10", "USD", held, entry("batch-a", "1")) is None


def test_the_ledger_is_bounded() -> None:
    status = CreditAccountStatus(
        reservations=[entry(f"batch-{i}", "0") for i in range(billing.MAX_RESERVATIONS)]
    )
    with pytest.raises(billing.TooManyReservations):
        billing.reserve("10", "USD", status, entry("batch-x", "0"))


# --- acceptance: the validated input against the reservation made at creation -----------------

WORKED_SIZE = billing.BatchSize(
    input_bytes=600_000,
    requests=1000,
    output_token_limits=900 * 256,
    requests_without_output_limit=100,
)


def held_at_creation(amount: str, pool_name: str = "pool-a") -> CreditReservation:
    """What the gateway reserved from the BatchFile's (here forged) sizes."""
    return CreditReservation(
        batch="batch-a",
        amount=amount,
        estimated_tokens=10,
        pool=pool_name,
        pricing=STANDARD,
        created_at=1000,
    )


def operators_entry(amount: str = "9") -> CreditReservation:
    """The operator's own reservation for the validated input, at the pool's current prices."""
    return CreditReservation(
        batch="batch-a",
        amount=amount,
        estimated_tokens=532_800,
        pool="pool-a",
        pricing=Pricing(input_per_million="5", output_per_million="5"),
        created_at=2000,
    )


def test_a_reservation_from_forged_sizes_is_raised_at_its_own_prices() -> None:
    held = held_at_creation("0.000001")
    wanted = billing.accepted_reservation(held, operators_entry(), pool(), WORKED_SIZE)
    # the validated input at the prices fixed at creation, not at the pool's current ones
    assert (wanted.amount, wanted.estimated_tokens) == ("0.299600", 532_800)
    assert (wanted.pricing, wanted.pool, wanted.created_at) == (STANDARD, "pool-a", 1000)
    status = billing.reserve("10", "USD", CreditAccountStatus(), held)
    assert status is not None
    topped = billing.top_up("10", "USD", status, wanted)
    assert topped is not None
    assert (topped.reserved, topped.available, topped.active_batches) == (
        "0.299600",
        "9.700400",
        1,
    )
    # validation running again: the reservation already is what the input needs
    again = billing.find(topped, "batch-a")
    assert again is not None
    assert billing.accepted_reservation(again, operators_entry(), pool(), WORKED_SIZE) == again
    assert billing.top_up("10", "USD", topped, wanted) is None


def test_a_reservation_that_covers_the_input_is_kept() -> None:
    held = held_at_creation("1")
    held = held.model_copy(update={"estimated_tokens": 600_000})
    assert billing.accepted_reservation(held, operators_entry(), pool(), WORKED_SIZE) == held


def test_a_top_up_that_does_not_fit_fails() -> None:
    held = held_at_creation("0.000001")
    status = billing.reserve("0.1", "USD", CreditAccountStatus(), held)
    assert status is not None
    wanted = billing.accepted_reservation(held, operators_entry(), pool(), WORKED_SIZE)
    with pytest.raises(billing.InsufficientCredit) as err:
        billing.top_up("0.1", "USD", status, wanted)
    assert "needs an estimated 0.299600 USD, 0.100000 USD is available" in str(err.value)
    # a batch without a reservation (settled, or never reserved) is not raised
    assert billing.top_up("10", "USD", CreditAccountStatus(), wanted) is None


def test_a_reservation_for_another_pool_takes_the_operators_terms() -> None:
    held = held_at_creation("0.000001", pool_name="pool-cheap")
    entry_ = operators_entry("0.5")
    assert billing.accepted_reservation(held, entry_, pool(), WORKED_SIZE) == entry_
    status = billing.reserve("10", "USD", CreditAccountStatus(), held)
    assert status is not None
    topped = billing.top_up("10", "USD", status, entry_)
    assert topped is not None
    assert billing.find(topped, "batch-a") == entry_
    assert topped.reserved == "0.500000"


def test_a_private_pool_reservation_is_raised_at_its_gpu_hour_price() -> None:
    private = pool(mode="GPUTime", gpuHourPrice="9.99")  # the price changed since creation
    held = CreditReservation(
        batch="batch-a",
        amount="0.000001",
        pool="pool-a",
        mode="GPUTime",
        gpu_hour_price="2.40",
        created_at=1000,
    )
    size = billing.BatchSize(50_000, 95, 95 * 256, 0)  # the file said 1 request
    wanted = billing.accepted_reservation(held, operators_entry(), private, size)
    assert (wanted.amount, wanted.mode, wanted.gpu_hour_price) == ("0.253334", "GPUTime", "2.40")


@pytest.mark.parametrize(
    ("phase", "usage", "expected"),
    [
        ("completed", (150_000, 200_000), "0.187500"),
        ("cancelled", (90_000, 120_000), "0.112500"),
        ("expired", (15_000, 20_000), "0.018750"),
        ("failed", (0, 0), "0.000000"),  # failed validation: nothing ran
    ],
)
def test_every_terminal_state_releases_the_reservation_and_charges_once(
    phase: str, usage: tuple[int, int], expected: str
) -> None:
    assert phase in TERMINAL
    status = billing.reserve("10", "USD", CreditAccountStatus(), entry("batch-a", "0.2996"))
    assert status is not None
    assert status.reserved == "0.299600"
    charge = billing.final_charge(
        "Tokens", pricing=STANDARD, input_tokens=usage[0], output_tokens=usage[1]
    )
    assert charge == expected
    settled = billing.settle("10", status, "batch-a", charge)
    assert settled is not None
    assert settled.reserved == "0.000000"
    assert settled.charged == expected
    assert settled.available == billing.money(Decimal(10) - Decimal(expected))
    assert settled.reservations is None
    assert settled.active_batches == 0
    # finalisation runs again (a lost status patch, a restarted operator): nothing more
    assert billing.settle("10", settled, "batch-a", charge) is None


def test_settling_one_batch_keeps_the_others() -> None:
    status = CreditAccountStatus()
    for name, amount in (("batch-a", "1"), ("batch-b", "2")):
        held = billing.reserve("10", "USD", status, entry(name, amount))
        assert held is not None
        status = held
    settled = billing.settle("10", status, "batch-a", "0.5")
    assert settled is not None
    assert [e.batch for e in settled.reservations or []] == ["batch-b"]
    assert (settled.reserved, settled.charged, settled.available) == (
        "2.000000",
        "0.500000",
        "7.500000",
    )


def test_actual_cost_above_the_estimate_is_charged_and_available_goes_negative() -> None:
    status = billing.reserve("1", "USD", CreditAccountStatus(), entry("batch-a", "1"))
    assert status is not None
    settled = billing.settle("1", status, "batch-a", "1.25")
    assert settled is not None
    assert settled.available == "-0.250000"
    with pytest.raises(billing.InsufficientCredit):
        billing.reserve("1", "USD", settled, entry("batch-b", "0.01"))


def test_collect_drops_orphans_without_charging() -> None:
    status = CreditAccountStatus(
        charged="1", reservations=[entry("batch-gone", "3"), entry("batch-live", "2")]
    )
    kept, dropped = billing.collect("10", status, lambda e: e.batch != "batch-gone")
    assert [e.batch for e in dropped] == ["batch-gone"]
    assert (kept.reserved, kept.charged, kept.available) == ("2.000000", "1.000000", "7.000000")


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=30))
def test_ledger_invariant_available_is_limit_minus_reserved_minus_charged(
    ops: list[tuple[int, int]],
) -> None:
    limit = "50"
    status = CreditAccountStatus()
    for i, (amount, charge) in enumerate(ops):
        try:
            held = billing.reserve(
                limit, "USD", status, entry(f"b-{i}", billing.money(Decimal(amount) / 10**5))
            )
        except billing.InsufficientCredit:
            continue
        assert held is not None
        status = held
        if i % 2:
            settled = billing.settle(
                limit, status, f"b-{i}", billing.money(Decimal(charge) / 10**5)
            )
            assert settled is not None
            status = settled
        total = Decimal(status.reserved) + Decimal(status.charged) + Decimal(status.available or 0)
        assert total == Decimal(limit)
        # reservations never push the account below zero; only actual charges can
        assert Decimal(status.reserved) <= Decimal(limit)


# --- GPU run time ------------------------------------------------------------------------------
