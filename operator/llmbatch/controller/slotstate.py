"""What the slot scheduler sees of a pool in one round: its work, its slots, the round's outcome.

Plain data and small pure helpers for :mod:`llmbatch.controller.slots`.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.resources.pool import FairSharing
from llmbatch.api.slot import Assignment, SlotHeartbeat
from llmbatch.controller.jobs import engine_args
from llmbatch.core import keys, shardbook, tiers
from llmbatch.core.scheduling import (
    MAX_WEIGHT,
    MIN_WEIGHT,
    Guarantee,
    QueuedShard,
    Shares,
    serving_key,
)
from llmbatch.core.slots import Saturation, SlotView
from llmbatch.core.workqueue import Priority
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
    pool: str
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
    draining: bool = False
    """Asked to drain: it takes no new shard, even before its heartbeat says it drains."""
    unreadable: bool = False
    """Its heartbeat could not be parsed: what it runs is unknown, so nothing is settled."""
    out_of_memory: bool = False
    """Lost because its pod was killed for memory (``OOMKilled``): the requests with media its
    last heartbeat named are blamed, not its other runs (``core.oomblame``)."""

    @property
    def open(self) -> bool:
        beat = self.heartbeat
        alive = beat is None or beat.state in ("starting", "ready")
        usable = not (self.outdated or self.draining or self.unreadable)
        return self.lost is None and usable and alive

    def running(self) -> set[str]:
        """Shards its last heartbeat says are still running (revoked ones included)."""
        beat = self.heartbeat
        return {r.key for r in beat.shards if r.state == "running"} if beat else set()

    def revoke(self, key: str) -> None:
        """Take the shard back from the slot (store call) and forget it in this round."""
        self.channel.revoke(key)
        self.assignments.pop(key, None)

    def queued(self) -> dict[str, Assignment]:
        """Its assignments its last heartbeat does not show started (queued, or just granted)."""
        running = self.running()
        return {k: a for k, a in self.assignments.items() if k not in running}


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
    """Shards still waiting for a slot after this round (those of a tenant at its maximum
    seats too)."""
    tenants: dict[str, Any] | None = None
    """The pool status's ``fairSharing`` (``controller.fairstate.tenant_status``)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    batch_events: list[tuple[dict[str, str], str, str]] = field(default_factory=list)
    """Warning Events for Batches: (the Batch's object reference, reason, message)."""
    saturation: Saturation | None = None
    """What this round proved about the next one from the same slots (``core.slots``): a new
    batch whose shards it holds for waits without a round (``PoolScheduler.join``)."""
    changed: dict[str, Priority] = field(default_factory=dict)
    """Batches (by uid) whose shards this round saw change — granted, ended, lost, taken back
    (SHARDS), or making progress (PROGRESS): the batches the round tells to reconcile."""

    def touch(self, batch_uid: str, priority: Priority) -> None:
        current = self.changed.get(batch_uid)
        self.changed[batch_uid] = priority if current is None else min(current, priority)


@dataclass
class Look:
    """The cheap part of a round: the pool's slots observed, what that found to report, and a
    signature of what placement depends on — a round whose look has the signature of the last
    full round, with no new work and nothing lost, has nothing to decide."""

    slots: list[ObservedSlot]
    result: SlotRound
    signature: tuple[Any, ...]

    @property
    def urgent(self) -> bool:
        """A slot is lost or outdated: the round must act on it."""
        return any(s.lost is not None or s.outdated for s in self.slots)


def slots_signature(slots: list[ObservedSlot]) -> tuple[Any, ...]:
    """What placement depends on of the slots: which exist and may take work, what each holds
    and what state each reports of it (not the progress counts)."""
    signature = []
    for s in sorted(slots, key=lambda slot: slot.name):
        beat = s.heartbeat
        reports = tuple(sorted((r.key, r.generation, r.state) for r in beat.shards)) if beat else ()
        signature.append(
            (
                s.name,
                s.lost is not None,
                s.outdated,
                s.draining,
                s.unreadable,
                beat.state if beat else None,
                beat.concurrency if beat else None,
                reports,
                tuple(sorted(s.assignments)),
            )
        )
    return tuple(signature)


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


def batch_work(pool_name: str, batch: dict[str, Any]) -> dict[str, Work]:
    """The unfinished shards of one batch, if it runs on pool ``pool_name``."""
    status = batch.get("status") or {}
    if status.get("pool") != pool_name or status.get("status") != "in_progress":
        return {}
    meta, spec = batch["metadata"], batch.get("spec") or {}
    uid, namespace = meta["uid"], meta["namespace"]
    tier = tiers.tier_of(spec.get("priority"), spec.get("metadata"))
    found: dict[str, Work] = {}
    unfinished = [
        (int(shard["index"]), int(shard.get("requestCount") or 0))
        for shard in status.get("shards") or []
        if shard.get("phase") not in shardbook.FINISHED
    ]
    for index, requests in unfinished + list(shardbook.raw_waiting(status)):
        prefix = keys.shard_prefix(namespace, uid, index)
        queued = QueuedShard(
            batch=f"{namespace}/{meta['name']}",
            tier=tier,
            created_at=float(status.get("createdAt") or 0),
            shard_index=index,
            requests=requests,
            model=serving_key(str(status.get("model") or ""), status.get("modelRevision")),
            revision=status.get("modelRevision"),
        )
        key = work_key(uid, index)
        found[key] = Work(
            queued=queued,
            key=key,
            spec_key=keys.shard_spec_key(namespace, uid, index),
            lease_key=keys.shard_lease_key(prefix),
            since=float(status.get("inProgressAt") or 0),
        )
    return found


class WorkMemo:
    """Every unfinished shard of a pool's running batches (the queue and the placed), each
    batch mapped (:func:`batch_work`) again only when its status changed.

    The running index (``controller.runningindex``) gives each change of a batch a new status
    object and never changes one in place, so a batch whose status is the object seen at the
    previous round has the same shards: a round over 10,000 queued batches of which a few
    changed maps a few (a profile of the operator with 6,000 queued found that mapping at ~6 %
    of its samples). Callers that change a status in place must pass a new object.
    """

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, tuple[dict[str, Any], dict[str, Work]]]] = {}

    def pool_work(self, pool_name: str, batches: list[dict[str, Any]]) -> dict[str, Work]:
        held = self._pools.get(pool_name, {})
        seen: dict[str, tuple[dict[str, Any], dict[str, Work]]] = {}
        found: dict[str, Work] = {}
        for batch in batches:
            status = batch.get("status") or {}
            uid = str(batch["metadata"]["uid"])
            before = held.get(uid)
            if before is not None and before[0] is status:
                work = before[1]
            else:
                work = batch_work(pool_name, batch)
            seen[uid] = (status, work)
            found.update(work)
        self._pools[pool_name] = seen  # batches no longer running are forgotten
        return found

    def forget_pool(self, pool_name: str) -> None:
        self._pools.pop(pool_name, None)


def pool_shares(
    work: Mapping[str, Work],
    held: Iterable[str],
    weight_of: Callable[[str], float],
    settings: FairSharing | None = None,
    usage: Mapping[str, float] | None = None,
) -> Shares:
    """The seats each tenant holds on the pool's slots (its shards ``held`` there, running or
    queued), the weights of the tenants with work in the pool (the pool's own for a tenant it
    names, else ``weight_of``), their recent use in seats and the pool's guarantees."""
    seats = Counter(work[key].queued.tenant for key in held if key in work)
    tenants = {w.queued.tenant for w in work.values()}
    named = {t.namespace: t for t in settings.tenants} if settings else {}
    weights = {}
    for tenant in tenants:
        own = named[tenant].weight if tenant in named else None
        weight = float(own) if own is not None else weight_of(tenant)
        weights[tenant] = min(MAX_WEIGHT, max(MIN_WEIGHT, weight))
    guarantees = {
        t.namespace: Guarantee(min_seats=t.min_seats, max_seats=t.max_seats) for t in named.values()
    }
    return Shares(seats=seats, weights=weights, usage=dict(usage or {}), guarantees=guarantees)


def slot_views(live: list[ObservedSlot], capacity: int, queue: int | None) -> list[SlotView]:
    """The live slots as placement sees them: a loaded slot holds the shards its heartbeat says
    it runs at once (sized from its engine when the pool does not say), others ``capacity``,
    and queues ``queue`` more (unset: as many as it runs)."""
    views = []
    for s in live:
        seats = (s.heartbeat.concurrency if s.heartbeat else None) or capacity
        views.append(
            SlotView(
                name=s.name,
                load=len(s.assignments.keys() | s.running()),
                capacity=seats,
                ready=s.heartbeat is not None and s.heartbeat.state == "ready",
                open=s.open,
                model=s.model,
                queued_tiers=tuple(a.shard.tier for a in s.queued().values()),
                queue=seats if queue is None else queue,
            )
        )
    return views


#: Container waiting reasons that mean a pod will not start by itself.
STUCK_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "CrashLoopBackOff",
        "RunContainerError",
    }
)


def pod_not_starting(pod: dict[str, Any]) -> str | None:
    """Why a slot's pod has not started its process, as a Kubernetes user would read it: the
    scheduler cannot place it, or its container waits on an image, a Secret or a config."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            reason = cond.get("reason") or "Unschedulable"
            return f"{reason}: {cond.get('message') or 'the pod cannot be scheduled'}"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_WAITING:
            return f"{waiting['reason']}: {waiting.get('message') or ''}".rstrip(": ")
    return None
