"""GPU time of a shard on a warm slot: its share of the slot's busy time (docs/billing.md).

While n requests are in the engine each accrues 1/n of the time to its shard, so the shares add
up to the busy time; idle time (a warm slot waiting) and queue time accrue to nobody.
"""

from __future__ import annotations

import pytest

from llmbatch.executor.sharedengine import BusyLedger


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_shares_split_the_busy_time_by_requests_in_the_engine() -> None:
    clock = Clock()
    ledger = BusyLedger(clock)
    clock.now += 50  # idle: the slot is warm, nothing runs
    ledger.enter("a")
    clock.now += 10  # a alone
    ledger.enter("b")
    ledger.enter("b")
    clock.now += 9  # one request of a, two of b: a 3 s, b 6 s
    ledger.leave("a")
    clock.now += 4  # b alone
    ledger.leave("b")
    ledger.leave("b")
    clock.now += 30  # idle again
    assert ledger.share("a") == pytest.approx(13.0)
    assert ledger.share("b") == pytest.approx(10.0)
    assert ledger.busy_seconds() == pytest.approx(23.0)
    assert ledger.share("a") + ledger.share("b") == pytest.approx(ledger.busy_seconds())


def test_nothing_accrues_without_a_request_in_the_engine() -> None:
    clock = Clock()
    ledger = BusyLedger(clock)
    clock.now += 600
    assert ledger.busy_seconds() == 0
    assert ledger.share("a") == 0
    assert ledger.in_engine() == 0
