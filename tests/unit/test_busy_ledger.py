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


def test_each_request_gets_its_own_share_and_they_add_up_to_its_shards() -> None:
    clock = Clock()
    ledger = BusyLedger(clock)
    first = ledger.enter("a")
    clock.now += 10  # alone: 10 s
    second = ledger.enter("a")
    third = ledger.enter("b")
    clock.now += 6  # three inside: 2 s each
    shares = [ledger.leave("a", first)]
    clock.now += 4  # two inside: 2 s each
    shares += [ledger.leave("a", second), ledger.leave("b", third)]
    assert shares == pytest.approx([12.0, 4.0, 4.0])
    assert shares[0] + shares[1] == pytest.approx(ledger.share("a"))
    assert sum(shares) == pytest.approx(ledger.busy_seconds())
