"""What a look at a slot's channel costs and sees: one listing, and a read of each assignment
only when it is new or rewritten since the last look (a slot looks several times a second).
Whatever it skips, it never misses a grant, a re-grant under a new generation, a revoke, an
assignment that became readable, or a rewrite the store tags as it tagged the object before
(a filesystem store's reused inode within one tick of its clock)."""

from __future__ import annotations

import dataclasses
import pathlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import Assignment
from llmbatch.core import keys
from llmbatch.storage.base import ObjectInfo
from llmbatch.storage.filesystem import FilesystemStore
from llmbatch.storage.slotchannel import TAG_SETTLE_SECONDS, SlotChannel

PREFIX = "slots/p/s"


def spec(uid: str) -> ShardSpec:
    return ShardSpec(
        batch_id=f"batch_{uid}",
        batch_uid=uid,
        endpoint="/v1/chat/completions",
        store="file:///s",
        input_key="in.jsonl",
        output_prefix=f"work/t/{uid}/shards/00000",
        model={"name": "m", "path": "/m"},
        engine={"name": "simulated", "args": {}},
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def settle(self) -> None:
        """Let every ETag listed so far settle."""
        self.now += TAG_SETTLE_SECONDS


def counting(store: FilesystemStore) -> Counter[str]:
    """Count the store's calls by method (the channel's own reads)."""
    calls: Counter[str] = Counter()
    for method in ("get", "list", "head"):
        original = getattr(store, method)

        def counted(*args: Any, _original: Any = original, _m: str = method) -> Any:
            calls[_m] += 1
            return _original(*args)

        setattr(store, method, counted)
    return calls


def test_a_look_reads_only_what_is_new_or_rewritten(tmp_path: pathlib.Path) -> None:
    store, clock = FilesystemStore(tmp_path), Clock()
    operator, slot = SlotChannel(store, PREFIX), SlotChannel(store, PREFIX, clock)
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=1))
    operator.assign(Assignment(shard=spec("b"), lease_key="lb", generation=1))
    calls = counting(store)

    first = slot.assignments()
    assert {a.generation for a in first.values()} == {1}
    assert len(first) == 2
    assert calls == {"list": 1, "get": 2}

    calls.clear()
    assert slot.assignments() == first
    assert calls == {"list": 1, "get": 2}  # tags seen for less than the settle time: read

    clock.settle()
    assert slot.assignments() == first  # read once more, now kept
    calls.clear()
    clock.settle()
    assert slot.assignments() == first
    assert calls == {"list": 1}  # nothing new: no reads

    # a re-grant under a new generation rewrites the same key: read again
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=2))
    operator.revoke(next(k for k, a in first.items() if a.shard.batch_uid == "b"))
    calls.clear()
    now = slot.assignments()
    assert [(a.shard.batch_uid, a.generation) for a in now.values()] == [("a", 2)]
    assert calls == {"list": 1, "get": 1}


def test_an_unreadable_assignment_is_read_again_until_it_parses(tmp_path: pathlib.Path) -> None:
    store = FilesystemStore(tmp_path)
    channel = SlotChannel(store, PREFIX)
    good = Assignment(shard=spec("a"), lease_key="la", generation=1)
    key = keys.slot_assignment_key(PREFIX, good.key)
    store.put(key, b"{not json")
    calls = counting(store)
    assert channel.assignments() == {}
    assert channel.unreadable == [good.key]
    assert channel.assignments() == {}
    assert calls["get"] == 2  # not remembered: looked at again each time
    store.put(key, good.model_dump_json().encode())
    assert channel.assignments() == {good.key: good}
    assert channel.unreadable == []


def test_an_assignment_revoked_and_granted_again_is_read_afresh(tmp_path: pathlib.Path) -> None:
    store, clock = FilesystemStore(tmp_path), Clock()
    operator, slot = SlotChannel(store, PREFIX), SlotChannel(store, PREFIX, clock)
    first = Assignment(shard=spec("a"), lease_key="la", generation=1)
    operator.assign(first)
    assert slot.assignments() == {first.key: first}
    clock.settle()
    assert slot.assignments() == {first.key: first}  # kept under its tag
    operator.revoke(first.key)
    assert slot.assignments() == {}
    again = Assignment(shard=spec("a"), lease_key="la", generation=3)
    operator.assign(again)
    assert slot.assignments() == {again.key: again}


class SameTags(FilesystemStore):
    """Lists every object under one ETag: what a filesystem gives a key revoked and written
    again within one tick of its clock, when the new file gets the freed inode and the same
    size. ``NoTags``: the empty ETag a store (or a proxy) may send."""

    tag = '"same"'

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for info in super().list(prefix):
            yield dataclasses.replace(info, etag=self.tag)


class NoTags(SameTags):
    tag = ""


def test_a_rewrite_under_the_same_tag_is_not_missed(tmp_path: pathlib.Path) -> None:
    store, clock = SameTags(tmp_path), Clock()
    operator, slot = SlotChannel(store, PREFIX), SlotChannel(store, PREFIX, clock)
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=1))
    assert [a.generation for a in slot.assignments().values()] == [1]
    clock.now += TAG_SETTLE_SECONDS / 2
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=2))  # same tag
    assert [a.generation for a in slot.assignments().values()] == [2]  # not settled: read
    clock.settle()
    assert [a.generation for a in slot.assignments().values()] == [2]
    calls = counting(store)
    clock.settle()
    assert [a.generation for a in slot.assignments().values()] == [2]
    assert calls == {"list": 1}  # settled: kept


def test_an_empty_etag_is_unknown_and_the_assignment_is_always_read(tmp_path: pathlib.Path) -> None:
    store, clock = NoTags(tmp_path), Clock()
    operator, slot = SlotChannel(store, PREFIX), SlotChannel(store, PREFIX, clock)
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=1))
    assert [a.generation for a in slot.assignments().values()] == [1]
    clock.settle()
    assert [a.generation for a in slot.assignments().values()] == [1]
    clock.settle()
    operator.assign(Assignment(shard=spec("a"), lease_key="la", generation=2))  # "" again
    calls = counting(store)
    assert [a.generation for a in slot.assignments().values()] == [2]
    assert calls == {"list": 1, "get": 1}
