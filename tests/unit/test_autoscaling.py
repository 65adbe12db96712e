"""Autoscaler maths: monotone in backlog, clamped, damped on the way down."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llmbatch.core.autoscaling import ScaleState, damp, learn_throughput, raw_desired_slots

DRAIN = {"expedited": 600, "standard": 43200, "flex": 172800}
backlogs = st.fixed_dictionaries(
    {tier: st.integers(0, 10_000_000) for tier in ("expedited", "standard", "flex")}
)


def test_formula() -> None:
    # 60,000 expedited requests at 10 req/s per slot with a 600 s target need 10 slots.
    assert raw_desired_slots({"expedited": 60_000}, 10.0, DRAIN, 0, 100) == 10
    # a standard backlog of the same size is fine with one slot (it may take 12 h)
    assert raw_desired_slots({"standard": 60_000}, 10.0, DRAIN, 0, 100) == 1
    assert raw_desired_slots({}, 10.0, DRAIN, 0, 100) == 0
    assert raw_desired_slots({}, 10.0, DRAIN, 2, 100) == 2


@given(
    a=backlogs,
    b=backlogs,
    tput=st.floats(0.01, 1000),
    lo=st.integers(0, 5),
    extra=st.integers(0, 50),
)
def test_monotone_and_clamped(
    a: dict[str, int], b: dict[str, int], tput: float, lo: int, extra: int
) -> None:
    hi = lo + extra + 1
    more = {t: a[t] + b[t] for t in a}
    small = raw_desired_slots(a, tput, DRAIN, lo, hi)
    large = raw_desired_slots(more, tput, DRAIN, lo, hi)
    assert lo <= small <= hi
    assert lo <= large <= hi
    assert small <= large
    if any(a.values()):
        assert small >= 1


def test_unknown_throughput_asks_for_everything() -> None:
    assert raw_desired_slots({"standard": 1}, 0.0, DRAIN, 0, 7) == 7


def test_throughput_ewma() -> None:
    assert learn_throughput(0.0, 100, 10.0) == 10.0
    assert learn_throughput(10.0, 200, 10.0) == 13.0
    assert learn_throughput(10.0, 0, 10.0) == 10.0


def test_damping_scales_up_at_once_and_down_after_cooldown() -> None:
    state = damp(ScaleState(desired=1), raw=5, now=0, cooldown_seconds=60)
    assert state.desired == 5
    state = damp(state, raw=2, now=10, cooldown_seconds=60)
    assert state == ScaleState(desired=5, below_since=10)
    state = damp(state, raw=3, now=40, cooldown_seconds=60)
    assert state.desired == 5
    state = damp(state, raw=6, now=50, cooldown_seconds=60)  # back up: the clock resets
    assert state == ScaleState(desired=6)
    state = damp(state, raw=1, now=60, cooldown_seconds=60)
    state = damp(state, raw=1, now=121, cooldown_seconds=60)
    assert state.desired == 1
