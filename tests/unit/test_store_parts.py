"""Multipart planning and key validation: pure functions of the storage package."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbatch.storage.base import InvalidKey, check_range, validate_key
from llmbatch.storage.parts import BufferedPart, CopyPart, Segment, plan_compose, streamed_part_size

MIN = 5


def _segments(part: CopyPart | BufferedPart) -> tuple[Segment, ...]:
    return (part.segment,) if isinstance(part, CopyPart) else part.segments


@given(st.lists(st.integers(0, 40), max_size=30), st.integers(MIN, 25))
def test_plan_compose_invariants(sizes: list[int], max_copy: int) -> None:
    sources = [(f"k{i}", size) for i, size in enumerate(sizes)]
    plan = plan_compose(sources, min_part=MIN, max_copy=max_copy)
    # The parts, in order, are exactly the bytes of the sources, in order.
    flat = [seg for part in plan for seg in _segments(part)]
    expected_bytes = [(key, i) for key, size in sources for i in range(size)]
    assert [(seg.key, i) for seg in flat for i in range(seg.start, seg.end)] == expected_bytes
    assert all(seg.size > 0 for seg in flat)
    # S3's rules: every part but the last >= the minimum; copies within the copy limit.
    assert all(part.size >= MIN for part in plan[:-1])
    for part in plan:
        if isinstance(part, CopyPart):
            assert MIN <= part.size <= max_copy
        else:
            assert part.size <= MIN  # bounded buffering
    assert sum(part.size for part in plan) == sum(sizes)


def test_plan_compose_examples() -> None:
    assert plan_compose([], min_part=MIN) == []
    assert plan_compose([("a", 0)], min_part=MIN) == []
    assert plan_compose([("a", 2), ("b", 1)], min_part=MIN) == [
        BufferedPart((Segment("a", 0, 2), Segment("b", 0, 1)))
    ]
    # Large sources are copied; a small one between them borrows the next one's head.
    assert plan_compose([("a", 6), ("b", 1), ("c", 10)], min_part=MIN, max_copy=100) == [
        CopyPart(Segment("a", 0, 6)),
        BufferedPart((Segment("b", 0, 1), Segment("c", 0, 4))),
        CopyPart(Segment("c", 4, 10)),
    ]
    # A source longer than the copy limit is split.
    assert plan_compose([("a", 12)], min_part=MIN, max_copy=5) == [
        CopyPart(Segment("a", 0, 5)),
        CopyPart(Segment("a", 5, 10)),
        BufferedPart((Segment("a", 10, 12),)),
    ]


def test_streamed_part_size_grows_to_cover_huge_streams() -> None:
    first = 8 << 20
    assert streamed_part_size(1, first) == first
    assert streamed_part_size(1000, first) == first
    assert streamed_part_size(1001, first) == 2 * first
    total = sum(streamed_part_size(n, first) for n in range(1, 10_001))
    assert total > 7 << 40  # > 7 TiB within S3's 10,000 parts
    assert streamed_part_size(10_000, 1 << 30) == 5 << 30  # capped at S3's largest part


@pytest.mark.parametrize(
    "key", ["a", "a/b/c.jsonl", "batches/batch_abc/shard-0001/chunk-000.jsonl", "ü/😀", "a.b/..c"]
)
def test_valid_keys(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize(
    "key",
    ["", "/a", "a/", "a//b", ".", "..", "a/../b", "./a", "a\\b", "a\nb", "a\x7fb", ".llmbatch-x"],
)
def test_invalid_keys(key: str) -> None:
    with pytest.raises(InvalidKey):
        validate_key(key)


def test_key_length_limit_counts_utf8_bytes() -> None:
    validate_key("a" * 1024)
    with pytest.raises(InvalidKey, match="longer"):
        validate_key("ü" * 513)


def test_check_range() -> None:
    check_range(0, None)
    check_range(5, 5)
    with pytest.raises(ValueError, match="start"):
        check_range(-1, None)
    with pytest.raises(ValueError, match="before"):
        check_range(3, 2)
