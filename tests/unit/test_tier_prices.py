"""Tier prices keep the documents' order (seed 004: expedited is the online rate, no batch
discount; seed 002: flex is the lowest price): the rule, the pool condition and its Events, and
the example pool that ships seed 002's price table."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.core.tierprices import CONDITION, price_condition, price_order_problems

ROOT = pathlib.Path(__file__).resolve().parents[2]


def pool(**tiers: tuple[str, str]) -> BatchPoolSpec:
    spec: dict[str, Any] = {"models": [{"name": "m", "source": "/m"}], "tiers": {}}
    for tier, (inp, out) in tiers.items():
        spec["tiers"][tier] = {
            "drainTargetSeconds": 60,
            "pricing": {"inputPerMillion": inp, "outputPerMillion": out},
        }
    return BatchPoolSpec.model_validate(spec)


def test_ordered_and_equal_prices_keep_the_order() -> None:
    assert price_order_problems(pool()) == []  # all free
    ordered = pool(expedited=("0.5", "1.5"), standard=("0.25", "0.75"), flex=("0.15", "0.45"))
    assert price_order_problems(ordered) == []
    same = pool(expedited=("1", "1"), standard=("1", "1"), flex=("1", "1"))
    assert price_order_problems(same) == []


def test_each_broken_pair_is_named() -> None:
    cheap_expedited = pool(expedited=("0.1", "1.5"), standard=("0.25", "0.75"))
    (problem,) = price_order_problems(cheap_expedited)
    assert "tiers.expedited inputPerMillion 0.1 is below tiers.standard's 0.25" in problem
    assert "online rate" in problem
    dear_flex = pool(expedited=("1", "1"), standard=("0.22", "0.22"), flex=("0.30", "0.10"))
    (problem,) = price_order_problems(dear_flex)
    assert "tiers.standard inputPerMillion 0.22 is below tiers.flex's 0.30" in problem
    assert "lowest price" in problem
    # only standard priced: the expedited default of 0 is below it, on both sides
    only_standard = pool(standard=("1000", "2000"))
    assert len(price_order_problems(only_standard)) == 2
    # unless the pool offers no expedited tier
    closed = only_standard.model_copy(update={"expedited_allowed": False})
    assert price_order_problems(closed) == []


def test_mixed_currencies_are_a_problem_and_gputime_pools_have_no_order() -> None:
    spec = pool(standard=("1", "1")).model_dump(by_alias=True)
    spec["tiers"]["flex"]["pricing"]["currency"] = "EUR"
    (problem,) = price_order_problems(BatchPoolSpec.model_validate(spec))
    assert "different currencies" in problem
    gpu = pool(standard=("1", "1")).model_copy(
        update={
            "billing": BatchPoolSpec.model_validate(spec).billing.model_copy(
                update={"mode": "GPUTime"}
            )
        }
    )
    assert price_order_problems(gpu) == []


def test_the_condition_warns_once_and_clears_with_a_normal_event() -> None:
    bad = pool(expedited=("0.1", "0.1"), standard=("0.2", "0.2"))
    conditions, event = price_condition(bad, None, 100.0)
    assert conditions is not None
    (cond,) = conditions
    assert (cond["type"], cond["status"], cond["reason"]) == (
        CONDITION,
        "False",
        "TierPricesOutOfOrder",
    )
    assert event is not None
    assert event[:2] == ("Warning", "TierPricesOutOfOrder")
    assert price_condition(bad, conditions, 200.0) == (None, None)  # written only when it differs
    good = pool(expedited=("0.3", "0.3"), standard=("0.2", "0.2"))
    cleared, event = price_condition(good, conditions, 300.0)
    assert cleared is not None
    assert cleared[0]["status"] == "True"
    assert event is not None
    assert event[:2] == ("Normal", "TierPricesOrdered")
    fresh, event = price_condition(good, None, 300.0)  # a new, well-priced pool: no Event
    assert fresh is not None
    assert event is None


def test_the_example_pool_ships_seed_002s_price_table() -> None:
    manifest = yaml.safe_load((ROOT / "examples" / "pool-qwen3.8-27b-batch.yaml").read_text())
    spec = BatchPoolSpec.model_validate(manifest["spec"])
    assert [m.name for m in spec.models] == ["qwen3.8-27b-batch"]
    assert spec.tiers.standard.pricing.input_per_million == "0.22"
    assert spec.tiers.standard.pricing.output_per_million == "0.22"
    assert spec.tiers.flex.pricing.input_per_million == "0.15"
    assert spec.tiers.flex.pricing.output_per_million == "0.15"
    assert spec.expedited_allowed is False  # seed 002 names no online rate
    assert price_order_problems(spec) == []
