"""The operator's work queue (``core.workqueue``): de-duplication, priority, times, backoff, and
a key added while it is reconciled (pure, on a test clock)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.core.workqueue import Backoff, Priority, WorkQueue


def drain(q: WorkQueue[str], now: float) -> list[str]:
    order = []
    while (key := q.pop(now)) is not None:
        order.append(key)
        q.done(key, now)
    return order


def test_a_key_added_twice_is_reconciled_once_at_its_best_priority() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a", Priority.RESYNC, 0.0)
    q.add("a", Priority.URGENT, 0.0)
    q.add("b", Priority.ADMIT, 0.0)
    assert len(q) == 2
    assert drain(q, 0.0) == ["a", "b"]


def test_priorities_then_tiers_then_time() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("resync", Priority.RESYNC, 0.0)
    q.add("progress", Priority.PROGRESS, 0.0)
    q.add("standard", Priority.ADMIT, 0.0, tier_rank=1)
    q.add("expedited", Priority.ADMIT, 1.0, tier_rank=0)
    q.add("cancel", Priority.URGENT, 2.0)
    q.add("shards", Priority.SHARDS, 0.0)
    assert drain(q, 5.0) == ["cancel", "expedited", "standard", "shards", "progress", "resync"]


def test_an_expedited_batch_goes_ahead_of_ten_thousand_resyncs() -> None:
    q: WorkQueue[int] = WorkQueue()
    for i in range(10_000):
        q.add(i, Priority.RESYNC, 0.0)
    q.add(-1, Priority.ADMIT, 1.0, tier_rank=0)
    assert q.pop(1.0) == -1


def test_a_key_is_not_handed_out_before_its_time() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("later", Priority.SHARDS, 0.0, due=10.0)
    assert q.pop(5.0) is None
    assert q.next_due() == 10.0
    assert q.pop(10.0) == "later"
    assert q.next_due() is None


def test_an_earlier_time_wins_and_the_later_entry_is_ignored() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a", Priority.RESYNC, 0.0, due=300.0)
    q.add("a", Priority.SHARDS, 0.0, due=1.0)
    assert q.pop(1.0) == "a"
    q.done("a", 1.0)
    assert q.pop(400.0) is None  # the resync was merged into the earlier reconcile


def test_a_key_added_while_reconciled_is_queued_again_after_and_never_handed_out_twice() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a", Priority.ADMIT, 0.0)
    assert q.pop(0.0) == "a"
    q.add("a", Priority.SHARDS, 0.0)  # a change arrives mid-reconcile
    assert q.pop(0.0) is None  # never to a second worker
    q.done("a", 0.0)
    assert q.pop(0.0) == "a"


def test_a_failed_reconcile_backs_off_exponentially_and_success_resets_it() -> None:
    q: WorkQueue[str] = WorkQueue(backoff=Backoff(base=1.0, cap=8.0, jitter=0.0))
    delays = []
    now = 0.0
    q.add("a", Priority.ADMIT, now)
    for _ in range(5):
        key = q.pop(now + 100)
        assert key == "a"
        delays.append(q.failed(key, now, Priority.ADMIT))
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert q.pop(now + 7.9) is None
    assert q.pop(now + 8.0) == "a"
    q.done("a", 8.0)
    assert q.failures("a") == 0


def test_jitter_spreads_keys_that_failed_together() -> None:
    q: WorkQueue[int] = WorkQueue(backoff=Backoff(base=4.0, jitter=0.1), rng=random.Random(1))
    for i in range(50):
        q.add(i, Priority.ADMIT, 0.0)
    delays = {q.failed(q.pop(0.0) or 0, 0.0, Priority.ADMIT) for _ in range(50)}
    assert len(delays) > 40
    assert all(3.6 <= d <= 4.4 for d in delays)


def test_forget_drops_a_key() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("gone", Priority.ADMIT, 0.0)
    q.forget("gone")
    assert q.pop(0.0) is None
    assert len(q) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 9),  # key
            st.sampled_from(list(Priority)),
            st.floats(0, 50),  # due offset
            st.booleans(),  # pop after this add
        ),
        max_size=60,
    )
)
def test_every_key_added_is_handed_out_exactly_once_per_pending_add(
    ops: list[tuple[int, Priority, float, bool]],
) -> None:
    """Whatever the adds and pops: no key is handed out while being reconciled, and once the
    queue is drained at a late time every key added is reconciled, in priority order."""
    q: WorkQueue[int] = WorkQueue()
    now = 0.0
    held: set[int] = set()
    for key, priority, offset, pop in ops:
        q.add(key, priority, now, due=now + offset, tier_rank=key % 3, tenant=f"t{key % 4}")
        if pop:
            got = q.pop(now)
            if got is not None:
                assert got not in held
                held.add(got)
        now += 1
    for key in list(held):
        q.done(key, now)
    seen: list[int] = []
    while (got := q.pop(now + 100)) is not None:
        assert got not in seen
        seen.append(got)
    assert {k for k, _, _, _ in ops} <= set(seen) | held


def test_waiting_tells_whether_work_of_a_priority_or_better_is_due() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("progress", Priority.PROGRESS, 0.0)
    queue.add("later", Priority.ADMIT, 0.0, due=5.0)
    assert not queue.waiting(1.0, Priority.ADMIT)
    assert queue.waiting(1.0, Priority.PROGRESS)
    assert queue.waiting(5.0, Priority.ADMIT)
    assert queue.pop(5.0) == "later"  # handed out: no longer waiting
    assert not queue.waiting(5.0, Priority.ADMIT)
    queue.add("progress", Priority.URGENT, 5.0)  # a better add supersedes the queued one
    assert queue.waiting(5.0, Priority.ADMIT)


# --- tiers across priorities, and tenants in turn ----------------------------------------------

EXPEDITED, STANDARD, FLEX = 0, 1, 2


def position(q: WorkQueue[str], wanted: str, now: float) -> int:
    """The 1-based place at which ``wanted`` is handed out (everything popped is done)."""
    for place, key in enumerate(drain(q, now), start=1):
        if key == wanted:
            return place
    raise AssertionError(f"{wanted} never handed out")


def test_a_flood_of_flex_creates_does_not_hold_up_another_tenants_expedited_finalisation() -> None:
    """10,000 flex acceptances of one tenant, then the shards of another tenant's expedited batch
    end: its finalisation is handed out first, not at place 10,001."""
    q: WorkQueue[str] = WorkQueue()
    for i in range(10_000):
        q.add(f"a-{i}", Priority.ADMIT, 0.0, tier_rank=FLEX, tenant="team-a")
    q.add("b-expedited", Priority.SHARDS, 1.0, tier_rank=EXPEDITED, tenant="team-b")
    assert position(q, "b-expedited", 1.0) == 1


def test_a_flood_of_one_tenants_creates_lets_another_tenant_of_the_tier_in_at_the_next_turn() -> (
    None
):
    q: WorkQueue[str] = WorkQueue()
    for i in range(10_000):
        q.add(f"a-{i}", Priority.ADMIT, float(i) / 10_000, tier_rank=STANDARD, tenant="team-a")
    q.add("b-standard", Priority.ADMIT, 1.0, tier_rank=STANDARD, tenant="team-b")
    q.add("c-flex", Priority.ADMIT, 1.0, tier_rank=FLEX, tenant="team-c")
    assert position(q, "b-standard", 1.0) <= 2
    q = WorkQueue()
    for i in range(10_000):
        q.add(f"a-{i}", Priority.ADMIT, 0.0, tier_rank=FLEX, tenant="team-a")
    q.add("c-flex", Priority.ADMIT, 1.0, tier_rank=FLEX, tenant="team-c")
    assert position(q, "c-flex", 1.0) <= 2


def test_a_batchs_later_steps_rank_above_acceptances_of_lower_tiers_only() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("flex-admit", Priority.ADMIT, 0.0, tier_rank=FLEX, tenant="a")
    q.add("standard-admit", Priority.ADMIT, 0.0, tier_rank=STANDARD, tenant="a")
    q.add("expedited-admit", Priority.ADMIT, 0.0, tier_rank=EXPEDITED, tenant="a")
    q.add("standard-shards", Priority.SHARDS, 0.0, tier_rank=STANDARD, tenant="b")
    q.add("expedited-shards", Priority.SHARDS, 0.0, tier_rank=EXPEDITED, tenant="b")
    q.add("expedited-progress", Priority.PROGRESS, 0.0, tier_rank=EXPEDITED, tenant="b")
    q.add("flex-cancel", Priority.URGENT, 0.0, tier_rank=FLEX, tenant="a")
    assert drain(q, 0.0) == [
        "flex-cancel",
        "expedited-admit",
        "expedited-shards",
        "standard-admit",
        "standard-shards",
        "flex-admit",
        "expedited-progress",
    ]


def test_tenants_take_turns_and_each_tenants_keys_keep_their_order() -> None:
    q: WorkQueue[str] = WorkQueue()
    for i in range(3):
        q.add(f"a{i}", Priority.ADMIT, float(i), tenant="a")
    for i in range(2):
        q.add(f"b{i}", Priority.ADMIT, 10.0 + i, tenant="b")
    q.add("c0", Priority.ADMIT, 20.0, tenant="c")
    assert drain(q, 30.0) == ["a0", "b0", "c0", "a1", "b1", "a2"]


def test_a_failed_key_keeps_its_tier_and_tenant() -> None:
    q: WorkQueue[str] = WorkQueue(backoff=Backoff(base=1.0, jitter=0.0))
    q.add("b", Priority.SHARDS, 0.0, tier_rank=EXPEDITED, tenant="team-b")
    assert q.pop(0.0) == "b"
    q.failed("b", 0.0, Priority.SHARDS)
    for i in range(100):
        q.add(f"a-{i}", Priority.ADMIT, 0.0, tier_rank=STANDARD, tenant="team-a")
    assert position(q, "b", 1.0) == 1
