"""Property: the shard plan covers every line exactly once with contiguous byte ranges."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.core.validation import iter_lines, validate_stream

CHAT = "/v1/chat/completions"


def _request(i: int, text: str) -> bytes:
    row = {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": text}]},
    }
    return json.dumps(row).encode()


@st.composite
def files(draw: st.DrawFn) -> bytes:
    kinds = draw(st.lists(st.sampled_from(["req", "blank", "ws"]), min_size=1, max_size=60))
    texts = st.text(max_size=20)
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    rows = []
    for i, kind in enumerate(kinds):
        if kind == "req":
            rows.append(_request(i, draw(texts)))
        elif kind == "blank":
            rows.append(b"")
        else:
            rows.append(b"  \t")
    data = newline.join(rows)
    if draw(st.booleans()):
        data += newline
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


@settings(max_examples=200, deadline=None)
@given(data=files(), shard_requests=st.integers(1, 7), chunk=st.integers(1, 97))
def test_plan_covers_every_line_once(data: bytes, shard_requests: int, chunk: int) -> None:
    pieces = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    result = validate_stream(pieces, endpoint=CHAT, shard_requests=shard_requests)
    assert result.ok or result.request_count == 0
    shards = result.shards
    if result.request_count == 0:
        return
    # contiguous, starting at 0 and ending at the file's end
    assert shards[0].start == 0
    assert shards[-1].end == len(data)
    for before, after in itertools.pairwise(shards):
        assert before.end == after.start
        assert after.first_line == before.first_line + before.line_count
    # every request exactly once, each shard within its size bound
    assert sum(s.request_count for s in shards) == result.request_count
    assert all(1 <= s.request_count <= shard_requests for s in shards[:-1])
    assert shards[-1].request_count <= shard_requests
    # reading each range yields exactly the lines the whole file yields, with the same numbers
    whole = list(iter_lines([data]))
    pieced = []
    for s in shards:
        got = list(iter_lines([data[s.start : s.end]], first_line=s.first_line))
        assert len(got) == s.request_count
        pieced.extend(got)
    assert pieced == whole
    assert sum(s.line_count for s in shards) == result.line_count


def test_a_big_input_on_small_shards_stays_within_the_shard_limit() -> None:
    """The plan lives in the Batch's status: 5,000 requests at shardRequests 1 would be 5,000
    shards (past the CRD's 1,000 and most of etcd's object limit); neighbours are joined."""
    from llmbatch.core.validation.shards import MAX_SHARDS

    data = b"\n".join(_request(i, "x") for i in range(5000)) + b"\n"
    result = validate_stream([data], endpoint=CHAT, shard_requests=1)
    assert result.ok
    assert result.request_count == 5000
    assert MAX_SHARDS // 2 <= len(result.shards) <= MAX_SHARDS
    assert [s.index for s in result.shards] == list(range(len(result.shards)))
    assert sum(s.request_count for s in result.shards) == 5000
    assert max(s.request_count for s in result.shards) <= 2 * -(-5000 // MAX_SHARDS)
    whole = list(iter_lines([data]))
    pieced = [
        line
        for s in result.shards
        for line in iter_lines([data[s.start : s.end]], first_line=s.first_line)
    ]
    assert pieced == whole


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.booleans(), min_size=1, max_size=200),
    size=st.integers(1, 5),
    limit=st.integers(2, 6),
)
def test_joined_shards_stay_contiguous(lines: list[bool], size: int, limit: int) -> None:
    from llmbatch.core.validation.shards import ShardCutter

    cutter = ShardCutter(size, limit=limit)
    for offset, is_request in enumerate(lines, start=1):
        cutter.add_line(is_request, offset * 10)
    cutter.close(len(lines) * 10)
    shards = cutter.shards
    assert len(shards) <= limit
    assert [s.index for s in shards] == list(range(len(shards)))
    assert shards[0].start == 0
    assert shards[-1].end == len(lines) * 10
    for before, after in itertools.pairwise(shards):
        assert before.end == after.start
        assert after.first_line == before.first_line + before.line_count
    assert sum(s.line_count for s in shards) == len(lines)
    assert sum(s.request_count for s in shards) == sum(lines)
