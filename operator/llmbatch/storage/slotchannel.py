"""The slot channel in the object store (models in :mod:`llmbatch.api.slot`).

Both sides use this module: the operator grants leases, writes and revokes assignments, asks
for a drain and reads heartbeats; the slot reads its assignments and the drain request, writes
its heartbeat and checks a shard's lease before each commit. Every write replaces a whole
object, so a retried or repeated message changes nothing; a lease is only ever changed by a
compare-and-swap on the version it was read at (:func:`update_lease`).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from pydantic import ValidationError

from llmbatch.api.slot import Assignment, ShardLease, ShardReport, SlotHeartbeat
from llmbatch.core import keys
from llmbatch.core.leases import LeaseEvent, transition
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


#: How long listings must have shown an assignment's ETag before a look keeps what it read
#: under that tag. The filesystem store tags a file by its inode, time and size; the kernel's
#: file clock ticks in milliseconds, and a key revoked and granted again within one tick may
#: get the freed inode back: the same tag on other bytes. A write that could carry a tag
#: happens within a tick of the tag's first listing, so once this long has passed, what a read
#: returns is the last object that will ever carry it. (S3's ETag is a hash of the bytes.)
TAG_SETTLE_SECONDS = 1.0


class _Seen(NamedTuple):
    """An assignment as a look at the channel last listed it."""

    tag: str
    since: float
    """When a listing first showed ``tag`` (the channel's clock)."""
    assignment: Assignment | None
    """What was read under ``tag``, kept once the tag has settled."""


class SlotChannel:
    """One slot's channel: ``slots/<pool>/<slot>/...`` in ``store``."""

    def __init__(
        self, store: ObjectStore, prefix: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.unreadable: list[str] = []
        """Assignments the last :meth:`assignments` could not parse (the slot reports them)."""
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        """Assignment key -> its ETag in the last listing, since when, and what was read under
        it once settled: a look at the channel reads only what is new or rewritten."""

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
        return self.read_heartbeat().heartbeat

    def read_heartbeat(self) -> HeartbeatReading:
        """The slot's last heartbeat as the operator reads it (see :class:`HeartbeatReading`)."""
        raw = self._get(keys.slot_heartbeat_key(self.prefix))
        if raw is None:
            return HeartbeatReading(None, None)
        return parse_heartbeat(raw)

    def clear(self) -> None:
        """Remove the whole channel (the slot is gone)."""
        delete_under(self.store, self.prefix + "/")

    # --- slot side -------------------------------------------------------------------------------

    def assignments(self) -> dict[str, Assignment]:
        """The shards currently assigned, by assignment key; an unreadable one is skipped (and
        named in :attr:`unreadable` until the next call).

        One listing, plus a read of each assignment the listing shows new or rewritten (its
        ETag changed: every write replaces the object): a slot looks several times a second,
        and its held assignments do not change between grants. What is read is kept under its
        ETag only once listings have shown that ETag for :data:`TAG_SETTLE_SECONDS`; an empty
        or missing ETag is unknown, never a match."""
        found: dict[str, Assignment] = {}
        seen: dict[str, _Seen] = {}
        unreadable: list[str] = []
        for info in self.store.list(keys.slot_assignments_prefix(self.prefix)):
            now, last = self._clock(), self._seen.get(info.key)
            if last is not None and last.tag == info.etag and last.assignment is not None:
                seen[info.key] = last
                found[last.assignment.key] = last.assignment
                continue
            since = last.since if last is not None and last.tag == info.etag else now
            raw = self._get(info.key)
            if raw is None:
                continue  # revoked between list and get
            try:
                assignment = Assignment.model_validate_json(raw)
            except ValidationError as exc:
                log.error("slot %s: unreadable assignment %s: %s", self.prefix, info.key, exc)
                unreadable.append(info.key.rsplit("/", 1)[-1].removesuffix(".json"))
                continue
            if info.etag:
                # Read after the listing: if it was rewritten in between, the next listing
                # shows another ETag and it is read again. A store that lists no ETag (or an
                # empty one) says nothing about a rewrite: such an assignment is read each time.
                settled = now - since >= TAG_SETTLE_SECONDS
                seen[info.key] = _Seen(info.etag, since, assignment if settled else None)
            found[assignment.key] = assignment
        self._seen = seen
        self.unreadable = unreadable
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


@dataclass(frozen=True)
class HeartbeatReading:
    """A heartbeat as read: the message, a stamp that changes with every write (liveness even
    when the message cannot be parsed), and what could not be read."""

    heartbeat: SlotHeartbeat | None
    stamp: str | None
    problem: str | None = None


def parse_heartbeat(raw: bytes) -> HeartbeatReading:
    """A heartbeat, tolerating a peer of another version: unknown fields are ignored (the
    models' rule), and a shard report this side cannot read is dropped, not the heartbeat."""
    stamp = hashlib.sha256(raw).hexdigest()[:16]
    try:
        return HeartbeatReading(SlotHeartbeat.model_validate_json(raw), stamp)
    except ValidationError as exc:
        first = _first_error(exc)
    try:
        value: Any = orjson.loads(raw)
        shards = value.get("shards") or []
        readable = [s for s in shards if _readable_report(s)]
        beat = SlotHeartbeat.model_validate({**value, "shards": readable})
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValidationError):
        return HeartbeatReading(None, stamp, f"unreadable heartbeat: {first}")
    dropped = len(shards) - len(readable)
    return HeartbeatReading(beat, stamp, f"{dropped} unreadable shard reports: {first}")


def _readable_report(value: Any) -> bool:
    try:
        ShardReport.model_validate(value)
    except ValidationError:
        return False
    return True


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg')}" if where else str(error.get("msg"))


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
    return update_lease(
        store, lease_key, lambda lease: transition(lease, LeaseEvent.GRANT, slot=slot, now=now)
    )


def fence_lease(store: ObjectStore, lease_key: str) -> ShardLease | None:
    """Close a shard's lease for its batch's finalisation: a new generation held by nobody, so
    a straggler's commit is refused, and the state ``fenced``, so no grant follows (a shard
    never placed gets a fenced lease too, which keeps a late grant from placing it)."""
    return update_lease(store, lease_key, lambda lease: transition(lease, LeaseEvent.FENCE))


class LeaseFence:
    """The check a runner makes before each write of its shard: is the lease still ours?

    Ours means granted, to this slot, at this generation. Every transition that takes a lease
    from a slot raises its generation (a grant elsewhere, a release, a failure, done, a fence),
    and a lease that is no longer ``granted`` fails the check too, so neither a given-up runner
    nor one that was paused while its lease moved on passes it.
    """

    def __init__(self, store: ObjectStore, lease_key: str, generation: int, slot: str) -> None:
        self.store = store
        self.lease_key = lease_key
        self.generation = generation
        self.slot = slot

    def lost(self) -> str | None:
        """None while the lease holds; else why it is lost."""
        try:
            lease = read_lease(self.store, self.lease_key)
        except ValidationError as exc:
            return f"lease {self.lease_key} is unreadable: {exc.errors()[0].get('msg')}"
        if lease is None:
            return f"lease {self.lease_key} is gone"
        if lease.generation != self.generation:
            return (
                f"lease generation {lease.generation} (slot {lease.slot or 'none'}) replaced "
                f"ours ({self.generation})"
            )
        if lease.state != "granted" or lease.slot != self.slot:
            return f"lease is {lease.state} (slot {lease.slot or 'none'}), no longer ours"
        return None


def clear_pool_channels(store: ObjectStore, pool: str) -> None:
    """Remove every slot channel of a deleted pool (once none of its slot pods is left)."""
    delete_under(store, keys.pool_slots_prefix(pool))
