"""Issue #30, item 4: a long plan's shard status stays bounded (core.shardbook)."""

from __future__ import annotations

import pytest

from llmbatch.api.resources import ShardStatus, SucceededShards
from llmbatch.core import shardbook
from llmbatch.core.validation.shards import ShardCutter, ShardRange


@pytest.mark.parametrize(
    ("indexes", "text"),
    [((), ""), ((3,), "3"), ((0, 1, 2, 5, 7, 8), "0-2,5,7-8"), ((9, 1, 0, 9), "0-1,9")],
)
def test_indexes_are_written_as_ranges_and_read_back(indexes: tuple[int, ...], text: str) -> None:
    assert shardbook.format_indexes(indexes) == text
    assert shardbook.parse_indexes(text) == set(indexes)


def test_the_stored_plan_reads_back_as_written() -> None:
    plan = [ShardRange(0, 0, 10, 1, 2, 2), ShardRange(1, 10, 17, 3, 3, 1)]
    assert shardbook.parse_plan(shardbook.plan_document(plan)) == plan
    ref = shardbook.plan_ref("k", plan)
    assert (ref.count, ref.shard_requests, ref.last_requests) == (2, 2, 1)
    assert [shardbook.requests_of(ref, i) for i in range(2)] == [2, 1]


@pytest.mark.parametrize(("lines", "size", "limit"), [(7, 2, 200), (999, 3, 16), (50, 1, 8)])
def test_every_shard_but_the_last_has_the_plan_size(lines: int, size: int, limit: int) -> None:
    # what the pool round takes a waiting unlisted shard's request count from (ShardPlanRef)
    cutter = ShardCutter(size=size, limit=limit)
    for i in range(lines):
        cutter.add_line(True, (i + 1) * 10)
    cutter.close(lines * 10)
    counts = [s.request_count for s in cutter.shards]
    assert len(set(counts[:-1])) <= 1
    assert counts[-1] <= counts[0]
    assert sum(counts) == lines


def _shard(index: int, phase: str, **fields: object) -> ShardStatus:
    return ShardStatus.model_validate(
        {"index": index, "start": 0, "end": 1, "firstLine": 1, "lineCount": 1,
         "requestCount": 1, "phase": phase, **fields}
    )  # fmt: skip


def test_compact_folds_the_succeeded_and_lists_what_is_worth_showing() -> None:
    shards = [
        _shard(0, "Succeeded", preemptions=1, reruns=2),
        _shard(1, "Running", job="slot-a"),
        _shard(2, "Pending"),  # never ran: not listed
        _shard(3, "Pending", reruns=1),  # waits again after a run: listed
        _shard(4, "Failed", message="boom"),
    ]
    listed, folded = shardbook.compact(shards, SucceededShards(indexes="7-9", count=3, reruns=1))
    assert [s.index for s in listed] == [1, 3, 4]
    assert folded == SucceededShards(indexes="0,7-9", count=4, preemptions=1, reruns=3)


def test_a_stale_view_of_an_already_folded_shard_is_not_counted_twice() -> None:
    # step acting on a view older than its own write still lists shard 0 as succeeded
    folded = SucceededShards(indexes="0", count=1, reruns=2)
    listed, again = shardbook.compact([_shard(0, "Succeeded", reruns=2)], folded)
    assert (listed, again) == ([], folded)


def test_the_waiting_unlisted_shards_of_a_raw_status() -> None:
    status = {
        "shardPlan": {"key": "k", "count": 6, "shardRequests": 4, "lastRequests": 1},
        "shards": [{"index": 2, "phase": "Running"}],
        "succeededShards": {"indexes": "0,4", "count": 2},
    }
    assert list(shardbook.raw_waiting(status)) == [(1, 4), (3, 4), (5, 1)]
    assert list(shardbook.raw_waiting({"shards": [{"index": 0}]})) == []  # listed whole
