"""The slot channel in the object store (models in :mod:`llmbatch.api.slot`).

Both sides use this module: the operator grants leases, writes and revokes assignments, asks
for a drain and reads heartbeats; the slot reads its assignments and the drain request, writes
its heartbeat and checks a shard's lease before each commit. Every write replaces a whole
object, so a retried or repeated message changes nothing; a lease is only ever changed by a
compare-and-swap on the version it was read at (:func:`update_lease`).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from pydantic import ValidationError

from llmbatch.api.slot import OPEN_LEASE_STATES, Assignment, ShardLease, SlotHeartbeat
from llmbatch.core import keys
from llmbatch.storage.base import (
    ObjectChanged,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    Versioned,
    delete_under,
)

log = logging.getLogger("llmbatch.storage")


class SlotChannel:
    """One slot's channel: ``slots/<pool>/<slot>/...`` in ``store``."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")

    # --- operator side ---------------------------------------------------------------------------

    def assign(self, assignment: Assignment) -> None:
        """Give the slot a shard (its lease must already name this slot and generation)."""
        key = keys.slot_assignment_key(self.prefix, assignment.key)
        self.store.put(key, assignment.model_dump_json().encode())

    def revoke(self, assignment_key: str) -> None:
        """Take a shard back: the slot stops feeding it, commits what finished and drops it."""
        self.store.delete(keys.slot_assignment_key(self.prefix, assignment_key))

    def request_drain(self) -> None:
        """Ask the slot to finish its shards, take no new ones and exit."""
        self.store.put(keys.slot_drain_key(self.prefix), b"drain\n")

    def keep_warm(self, keep: bool) -> None:
        """Ask the slot to stay up past its idle time (one of the pool's ``minSlots``), or not."""
        key = keys.slot_keep_key(self.prefix)
        if keep:
            self.store.put(key, b"keep\n")
        else:
            self.store.delete(key)

    def heartbeat(self) -> SlotHeartbeat | None:
        """The slot's last heartbeat, or None before its first (or when unreadable)."""
        raw = self._get(keys.slot_heartbeat_key(self.prefix))
        if raw is None:
            return None
        try:
            return SlotHeartbeat.model_validate_json(raw)
        except ValidationError as exc:
            log.warning("slot %s: unreadable heartbeat: %s", self.prefix, exc)
            return None

    def clear(self) -> None:
        """Remove the whole channel (the slot is gone)."""
        delete_under(self.store, self.prefix + "/")

    # --- slot side -------------------------------------------------------------------------------

    def assignments(self) -> dict[str, Assignment]:
        """The shards currently assigned, by assignment key; an unreadable one is skipped."""
        found: dict[str, Assignment] = {}
        for info in self.store.list(keys.slot_assignments_prefix(self.prefix)):
            raw = self._get(info.key)
            if raw is None:
                continue  # revoked between list and get
            try:
                assignment = Assignment.model_validate_json(raw)
            except ValidationError as exc:
                log.error("slot %s: unreadable assignment %s: %s", self.prefix, info.key, exc)
                continue
            found[assignment.key] = assignment
        return found

    def drain_requested(self) -> bool:
        return self.store.head(keys.slot_drain_key(self.prefix)) is not None

    def keep_requested(self) -> bool:
        return self.store.head(keys.slot_keep_key(self.prefix)) is not None

    def write_heartbeat(self, heartbeat: SlotHeartbeat) -> None:
        self.store.put(keys.slot_heartbeat_key(self.prefix), heartbeat.model_dump_json().encode())

    def _get(self, key: str) -> bytes | None:
        try:
            return self.store.get(key)
        except ObjectNotFound:
            return None


def read_lease(store: ObjectStore, lease_key: str) -> ShardLease | None:
    """A shard's lease, or None when it has none (a shard run outside a slot pool)."""
    try:
        raw = store.get(lease_key)
    except ObjectNotFound:
        return None
    return ShardLease.model_validate_json(raw)


#: Writers that may race one lease update before it gives up (there are two: the pool round
#: and the batch's finalisation, both in the operator).
LEASE_UPDATE_ATTEMPTS = 8


def update_lease(
    store: ObjectStore,
    lease_key: str,
    change: Callable[[ShardLease | None], ShardLease | None],
) -> ShardLease | None:
    """Read-modify-write of a shard's lease as one compare-and-swap (operator side).

    ``change`` gets the lease as it is (None when the shard has none) and returns the next one,
    or None to leave it as it is. When another writer got in between, ``change`` is applied
    again to what that writer left, so no update is lost and no decision is taken on a lease
    that is no longer there. Returns what was written, or None.
    """
    for attempt in range(LEASE_UPDATE_ATTEMPTS):
        if attempt:  # lost a race: back off a little, at random, so racers do not meet again
            time.sleep(random.uniform(0, 0.002 * 2**attempt))
        try:
            current: Versioned | None = store.get_versioned(lease_key)
        except ObjectNotFound:
            current = None
        lease = None if current is None else ShardLease.model_validate_json(current.data)
        updated = change(lease)
        if updated is None:
            return None
        body = updated.model_dump_json().encode()
        try:
            if current is None:
                store.put(lease_key, body, if_absent=True)
            else:
                store.put_if_match(lease_key, body, current.version)
        except (ObjectExists, ObjectChanged):
            continue
        return updated
    raise StoreError(f"lease {lease_key}: {LEASE_UPDATE_ATTEMPTS} updates in a row lost a race")


def grant_lease(store: ObjectStore, lease_key: str, slot: str, now: float) -> ShardLease | None:
    """Give the shard to ``slot`` under the next generation, which fences any earlier holder's
    later commits out. None when the shard may not run again (done, failed, or fenced by its
    batch's finalisation, which may have happened after the caller looked)."""

    def grant(previous: ShardLease | None) -> ShardLease | None:
        if previous is not None and previous.state not in OPEN_LEASE_STATES:
            return None
        base = previous or ShardLease(generation=0, state="released")
        return base.model_copy(
            update={
                "generation": base.generation + 1,
                "slot": slot,
                "granted_at": now,
                "state": "granted",
            }
        )

    return update_lease(store, lease_key, grant)


def fence_lease(store: ObjectStore, lease_key: str) -> ShardLease | None:
    """Close a shard's lease for its batch's finalisation: a new generation held by nobody, so
    a straggler's commit is refused, and the state ``fenced``, so no grant follows."""

    def fence(lease: ShardLease | None) -> ShardLease | None:
        if lease is None:  # never placed: a fenced lease keeps a late grant from placing it
            return ShardLease(generation=1, slot="", state="fenced")
        if lease.state not in OPEN_LEASE_STATES:
            return None
        return lease.model_copy(
            update={"generation": lease.generation + 1, "slot": "", "state": "fenced"}
        )

    return update_lease(store, lease_key, fence)


class LeaseFence:
    """The check a runner makes before each commit: is the shard's lease still ours?"""

    def __init__(self, store: ObjectStore, lease_key: str, generation: int) -> None:
        self.store = store
        self.lease_key = lease_key
        self.generation = generation

    def lost(self) -> str | None:
        """None while the lease holds; else why it is lost (a newer generation or no lease)."""
        lease = read_lease(self.store, self.lease_key)
        if lease is None:
            return f"lease {self.lease_key} is gone"
        if lease.generation != self.generation:
            return (
                f"lease generation {lease.generation} (slot {lease.slot}) replaced ours "
                f"({self.generation})"
            )
        return None


def clear_pool_channels(store: ObjectStore, pool: str) -> None:
    """Remove every slot channel of a deleted pool (once none of its slot pods is left)."""
    delete_under(store, keys.pool_slots_prefix(pool))
