"""Pure lifecycle helpers: windows, conditions, never-run lines, cost."""

from __future__ import annotations

import orjson
import pytest

from llmbatch.core.ids import batch_request_id
from llmbatch.core.lifecycle import cost_of, never_run_line, set_condition, window_seconds


def test_windows() -> None:
    assert window_seconds("24h") == 86400
    assert window_seconds("72h") == 259200
    assert window_seconds("30m") == 1800
    assert window_seconds("90s") == 90
    for bad in ("", "h", "24", "1d", "-1h"):
        with pytest.raises(ValueError, match="bad completion window"):
            window_seconds(bad)


def test_condition_time_moves_only_on_flip() -> None:
    first = set_condition(None, "Ready", False, "Validating", "...", 100)
    assert first[0]["lastTransitionTime"] == "1970-01-01T00:01:40Z"
    same = set_condition(first, "Ready", False, "Running", "now running", 200)
    assert same[0]["lastTransitionTime"] == "1970-01-01T00:01:40Z"
    assert same[0]["reason"] == "Running"
    flipped = set_condition(same, "Ready", True, "Completed", "done", 300)
    assert flipped[0]["lastTransitionTime"] == "1970-01-01T00:05:00Z"
    assert first[0]["reason"] == "Validating"  # inputs are never mutated


@pytest.mark.parametrize("code", ["batch_expired", "batch_cancelled", "shard_failed"])
def test_never_run_lines_follow_the_contract(code: str) -> None:
    line = orjson.loads(never_run_line("uid", "c-1", code, "exit code 70"))
    assert line["id"] == batch_request_id("uid", "c-1")
    assert line["response"] is None
    assert line["error"]["code"] == code
    assert line["error"]["message"]
    assert set(line) == {"id", "custom_id", "response", "error"}


def test_expired_message_is_openais() -> None:
    line = orjson.loads(never_run_line("u", "c", "batch_expired"))
    assert line["error"]["message"] == (
        "This request could not be executed before the completion window expired."
    )


def test_cost_is_exact_decimal() -> None:
    assert cost_of(1_000_000, 500_000, "0.22", "0.22") == "0.330000"
    assert cost_of(3, 7, "0.15", "0.60") == "0.000005"
    assert cost_of(0, 0, "1", "1") == "0.000000"


def test_the_phase_table_is_the_lifecycle_and_terminal_phases_absorb() -> None:
    import itertools

    from llmbatch.api.resources import Phase
    from llmbatch.core.lifecycle import (
        PHASE_TRANSITIONS,
        TERMINAL,
        IllegalTransition,
        check_transition,
    )

    phases = [p.value for p in Phase]
    assert set(PHASE_TRANSITIONS) == {None, *phases}
    for before, after in itertools.product([None, *phases], phases):
        if after in PHASE_TRANSITIONS[before]:
            check_transition(before, after)
        else:
            with pytest.raises(IllegalTransition):
                check_transition(before, after)
    for terminal in TERMINAL:
        assert PHASE_TRANSITIONS[terminal] == frozenset()
    # every phase is reachable from a new batch
    reached, frontier = set(), {None}
    while frontier:
        nxt = {a for b in frontier for a in PHASE_TRANSITIONS[b]} - reached
        reached |= nxt
        frontier = nxt  # type: ignore[assignment]
    assert reached == set(phases)
