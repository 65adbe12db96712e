"""What the slot scheduler sees of a pool in one round: its work, its slots, the round's outcome.

Plain data and small pure helpers for :mod:`llmbatch.controller.slots`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.slot import Assignment, SlotHeartbeat
from llmbatch.controller.jobs import engine_args
from llmbatch.core import keys
from llmbatch.core.scheduling import QueuedShard
from llmbatch.storage.slotchannel import SlotChannel


@dataclass(frozen=True)
class Work:
    """An unfinished shard of a running batch of the pool."""

    queued: QueuedShard
    key: str
    """Its assignment key (``<batch uid>-<shard index>``)."""
    spec_key: str
    lease_key: str
    since: float
    """When its batch started to run (the wait for a first assignment counts from there)."""


@dataclass
class ObservedSlot:
    """One slot as this round sees it."""

    name: str
    model: str
    channel: SlotChannel
    heartbeat: SlotHeartbeat | None
    assignments: dict[str, Assignment]
    lost: str | None
    """Why its shards must go elsewhere (Job ended, heartbeat lapsed); None while alive."""
    exited: bool = False
    """It ended by itself (idle, drained): what it still held is re-queued without blame."""
    outdated: bool = False
    """Started before its pool was edited (another slot revision): it takes no new shard."""

    @property
    def open(self) -> bool:
        beat = self.heartbeat
        alive = beat is None or beat.state in ("starting", "ready")
        return self.lost is None and not self.outdated and alive

    def running(self) -> set[str]:
        """Shards its last heartbeat says are still running (revoked ones included)."""
        beat = self.heartbeat
        return {r.key for r in beat.shards if r.state == "running"} if beat else set()


@dataclass
class SlotRound:
    """What one round did, for the pool's status and Events."""

    warm: int = 0
    busy: int = 0
    learned: list[tuple[int, float]] = field(default_factory=list)
    """(requests, busy seconds) of each shard that finished this round (throughput)."""
    run_seconds: list[float] = field(default_factory=list)
    """Assignment to done, of each shard that finished this round."""
    waiting: list[QueuedShard] = field(default_factory=list)
    """Shards still waiting for a slot after this round."""
    events: list[tuple[str, str, str]] = field(default_factory=list)


def work_key(batch_uid: str, shard_index: int) -> str:
    return f"{batch_uid}-{shard_index:05d}"


def new_slot_name(pool: str) -> str:
    """A fresh slot (Job) name: ``<pool>-slot-<6 hex>``, at most 52 characters."""
    return f"{pool[:40].rstrip('-.')}-slot-{secrets.token_hex(3)}"


def lease_key(assignment: Assignment) -> str:
    return keys.shard_lease_key(assignment.shard.output_prefix)


def job_ended(job: dict[str, Any]) -> str | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            detail = cond.get("message") or cond.get("reason") or ""
            return f"slot Job {cond['type'].lower()}" + (f": {detail}" if detail else "")
    return None


def max_num_seqs(pool: BatchPoolSpec) -> int:
    value = engine_args(pool).get("max_num_seqs")
    return int(value) if isinstance(value, int) else 256
