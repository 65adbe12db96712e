"""The fence inside ``ShardResults``: a run writes its shard (chunks, progress, final state) only
while the lease is granted, to its slot, at its generation; a paused run can never overwrite
what the shard's new holder wrote (#31)."""

from __future__ import annotations

import pathlib

import pytest

from llmbatch.api.slot import ShardLease
from llmbatch.core.leases import LeaseEvent, transition
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import ObjectInfo
from llmbatch.storage.shardresults import Fenced, ShardResults, list_chunks, read_progress
from llmbatch.storage.slotchannel import LeaseFence, grant_lease, read_lease, update_lease
from tests.unit.test_executor_chunks import _line as line

PREFIX = "work/tenant/uid/shards/00000"
LEASE = PREFIX + "/lease.json"


@pytest.fixture
def store(tmp_path: pathlib.Path) -> FilesystemStore:
    return FilesystemStore(tmp_path / "store")


def run(store: FilesystemStore, slot: str, generation: int) -> ShardResults:
    results = ShardResults(
        store,
        PREFIX,
        batch_id="batch_x",
        shard_index=0,
        fence=LeaseFence(store, LEASE, generation, slot),
        generation=generation,
    )
    results.recover()
    return results


def granted(store: FilesystemStore, slot: str) -> int:
    lease = grant_lease(store, LEASE, slot, 1.0)
    assert lease is not None
    return lease.generation


@pytest.mark.parametrize("event", [LeaseEvent.RELEASE, LeaseEvent.DONE, LeaseEvent.FAIL])
def test_a_lease_taken_from_its_slot_fails_the_fence(
    store: FilesystemStore, event: LeaseEvent
) -> None:
    generation = granted(store, "slot-a")
    fence = LeaseFence(store, LEASE, generation, "slot-a")
    assert fence.lost() is None
    update_lease(store, LEASE, lambda lease: transition(lease, event))
    assert fence.lost() is not None


def test_a_lease_that_kept_its_generation_but_left_the_slot_fails_the_fence(
    store: FilesystemStore,
) -> None:
    """Before #31 the fence compared the generation only: a released lease of the same
    generation (an operator of the old rules) still let a given-up runner write."""
    store.put(LEASE, ShardLease(generation=3, slot="", state="released").model_dump_json().encode())
    assert LeaseFence(store, LEASE, 3, "slot-a").lost() is not None
    store.put(LEASE, ShardLease(generation=3, slot="slot-b").model_dump_json().encode())
    assert LeaseFence(store, LEASE, 3, "slot-a").lost() is not None


def test_a_paused_run_cannot_overwrite_the_new_holders_progress(store: FilesystemStore) -> None:
    old = run(store, "slot-a", granted(store, "slot-a"))
    old.commit({"output": [line("r0")]})
    # slot-a was given up for lost while it paused; slot-b holds the shard and starts.
    new = run(store, "slot-b", granted(store, "slot-b"))
    new.write_progress(state="running")
    with pytest.raises(Fenced):
        old.write_progress(state="done", done=True)
    with pytest.raises(Fenced):
        old.commit({"output": [line("r1")]})
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert (progress.state, progress.done, progress.generation) == ("running", False, 2)
    assert len(list_chunks(store, PREFIX, "output")) == 1


class StaleFence:
    """A fence checked before the lease moved: it passes, as a run paused right after its
    check would."""

    def lost(self) -> str | None:
        return None


def test_a_run_paused_after_its_check_is_refused_by_the_progress_swap(
    store: FilesystemStore,
) -> None:
    old = run(store, "slot-a", granted(store, "slot-a"))
    new = run(store, "slot-b", granted(store, "slot-b"))
    new.write_progress(state="running")
    old.fence = StaleFence()
    with pytest.raises(Fenced, match="newer"):
        old.write_progress(state="done", done=True)
    progress = read_progress(store, PREFIX)
    assert progress is not None
    assert progress.generation == 2


class MovesOnCollision(FilesystemStore):
    """Another holder commits chunk 0 and takes the lease just before this run's first chunk."""

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        self.armed = True

    def put(self, key: str, data: object, **kwargs: object) -> ObjectInfo:
        if self.armed and "/output-" in key:
            self.armed = False
            plain = FilesystemStore(self.root)
            plain.put(key, line("theirs").data, if_absent=True)
            grant_lease(plain, LEASE, "slot-b", 2.0)
        return super().put(key, data, **kwargs)  # type: ignore[arg-type]


def test_after_a_chunk_name_collision_the_fence_is_checked_again(tmp_path: pathlib.Path) -> None:
    """Before #31 a run that found its chunk name taken scanned, then wrote the next chunk
    without looking at its lease again."""
    store = MovesOnCollision(tmp_path / "store")
    old = run(store, "slot-a", granted(store, "slot-a"))
    with pytest.raises(Fenced):
        old.commit({"output": [line("r0"), line("r1")]})
    assert len(list_chunks(store, PREFIX, "output")) == 1  # theirs only
    lease = read_lease(store, LEASE)
    assert lease is not None
    assert lease.slot == "slot-b"
