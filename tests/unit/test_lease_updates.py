"""Shard leases change only by compare-and-swap: a grant and finalisation's fence that race on
one lease never both take effect, whichever reads first (the interleavings are forced: the
other writer runs between a writer's read and its write)."""

from __future__ import annotations

import contextlib
import pathlib
import threading
from collections.abc import Callable

import pytest

from llmbatch.api.slot import ShardLease
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import StoreError, Versioned
from llmbatch.storage.slotchannel import (
    LeaseFence,
    fence_lease,
    grant_lease,
    read_lease,
    update_lease,
)

KEY = "work/tenant/uid/shards/00000/lease.json"


class CutIn(FilesystemStore):
    """A store where ``other`` writes right after this writer's first read of the lease."""

    def __init__(self, root: pathlib.Path, other: Callable[[], object]) -> None:
        super().__init__(root)
        self.other: Callable[[], object] | None = other
        self.reads = 0

    def _cut_in(self) -> None:
        self.reads += 1
        if self.other is not None:
            other, self.other = self.other, None
            other()

    def get_versioned(self, key: str) -> Versioned:
        try:
            return super().get_versioned(key)
        finally:
            self._cut_in()


@pytest.fixture
def store(tmp_path: pathlib.Path) -> FilesystemStore:
    return FilesystemStore(tmp_path / "store")


def released(store: FilesystemStore, generation: int = 2) -> None:
    lease = ShardLease(generation=generation, slot="slot-a", state="released", attempts=1)
    store.put(KEY, lease.model_dump_json().encode())


def test_a_grant_that_loses_the_race_to_finalisation_places_nothing(
    store: FilesystemStore,
) -> None:
    released(store)
    racing = CutIn(store.root, lambda: fence_lease(store, KEY))
    assert grant_lease(racing, KEY, "slot-b", 100.0) is None
    lease = read_lease(store, KEY)
    assert lease is not None
    assert (lease.generation, lease.slot, lease.state) == (3, "", "fenced")
    assert racing.reads == 2  # read, lost the swap, read again and refused


def test_a_fence_that_loses_the_race_to_a_grant_still_fences_the_granted_run(
    store: FilesystemStore,
) -> None:
    released(store)
    granted: list[ShardLease | None] = []
    racing = CutIn(store.root, lambda: granted.append(grant_lease(store, KEY, "slot-b", 100.0)))
    fenced = fence_lease(racing, KEY)
    assert granted[0] is not None
    assert granted[0].generation == 3
    assert fenced is not None
    assert (fenced.generation, fenced.state) == (4, "fenced")
    assert fenced.attempts == 1  # the grant's fields were kept, not the fence's stale read
    # The run slot-b was granted cannot commit: its generation is gone.
    assert LeaseFence(store, KEY, granted[0].generation, "slot-b").lost() is not None


def test_a_shard_never_placed_is_fenced_even_when_a_first_grant_races_it(
    store: FilesystemStore,
) -> None:
    racing = CutIn(store.root, lambda: fence_lease(store, KEY))  # after the grant finds none
    assert grant_lease(racing, KEY, "slot-b", 100.0) is None
    lease = read_lease(store, KEY)
    assert lease is not None
    assert (lease.generation, lease.state) == (1, "fenced")
    assert racing.reads == 2  # its create lost to the fence's; it read again and refused


def test_concurrent_updates_are_never_lost(store: FilesystemStore) -> None:
    """Four writers in a hot loop: every update that returned is in the lease exactly once (an
    update may give up after losing too many races in a row; it then says so)."""
    released(store, generation=0)
    barrier = threading.Barrier(4)
    applied: list[int] = []

    def one_more(lease: ShardLease | None) -> ShardLease | None:
        assert lease is not None
        return lease.model_copy(update={"preemptions": lease.preemptions + 1})

    def count() -> None:
        barrier.wait()
        for _ in range(25):
            with contextlib.suppress(StoreError):
                update_lease(store, KEY, one_more)
                applied.append(1)

    threads = [threading.Thread(target=count) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lease = read_lease(store, KEY)
    assert lease is not None
    assert lease.preemptions == len(applied)
    assert len(applied) > 50
