"""The pool scheduler: sizes a pool and places its shards on warm slots.

Level-based, all state on the Batches, the slot Jobs and the store. Each round computes the
backlog of the pool's running batches per tier, the desired slot count from it
(``core.autoscaling``), then lets :class:`~llmbatch.controller.slots.SlotScheduler` settle the
shard runs that ended and give the queue head to warm slots with room, starting a slot only when
none has room and the desired count allows it. Slots with nothing to run exit after the pool's
``idleSeconds`` (scale to zero); pods that cannot be placed yet stay Pending, which is the
cluster autoscaler's cue to add GPU nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from llmbatch.api.resources import API_VERSION, BatchPoolSpec
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import Kube
from llmbatch.controller.roundcost import RoundCost, user_cpu
from llmbatch.controller.runningindex import running_entry
from llmbatch.controller.slots import SlotScheduler
from llmbatch.controller.slotstate import Look, SlotRound, batch_work
from llmbatch.core import shardbook
from llmbatch.core.autoscaling import ScaleState, damp, learn_throughput, raw_desired_slots
from llmbatch.core.slots import Saturation
from llmbatch.core.tiers import TIERS, tier_of
from llmbatch.core.workqueue import Priority
from llmbatch.storage.base import ObjectStore

#: A pool's next round starts no sooner than this many times its last full round's cost
#: after that round ended, kicks or not: with thousands of batches running, a full round walks
#: them all, and a round per acceptance would take the whole loop (acceptance slowed with
#: depth). At most about a quarter of the operator's CPU goes to one pool's rounds; a round of
#: 100 ms (about 10,000 batches) is followed by the next within 0.3 s. The cost is the CPU the
#: round itself took from the event loop: the user CPU of its own steps on the loop and of its
#: store calls in threads (``controller.roundcost``), at most its wall time. Not its wall time:
#: a round that grants a hundred shards waits most of its 0.3 to 0.5 s on store writes. Not the
#: loop's CPU over the round's span, nor its threads' kernel time (their fsyncs): under #30's
#: burst either paced the rounds 0.5 to 0.75 s apart while accepted batches waited for their
#: grants.
ROUND_PACE = 3.0
#: ... but never more than this long.
PACE_LIMIT = 1.0
#: How long a batch accepted here counts as running without the watch showing it (a missed
#: event must not keep a batch in the rounds).
ACCEPTED_TTL = 60.0
#: While a round has left shards waiting for a seat, the next round starts this long after it
#: started: a seat a finished shard frees is seen only in a round (the slots' heartbeats).
BACKLOG_RECHECK = 0.5
#: Status fields that only report (slots in use, queue depth, the learned throughput): while
#: rounds follow each other they are patched at most once per REPORT_SECONDS, since a round's
#: next one waits for its status patch and that is slow on a busy API server. A change of the
#: scaling state (``desiredSlots``, ``scaleDownSince``) is patched at once.
REPORT_FIELDS = frozenset(
    {"slotsInUse", "warmSlots", "queueDepth", "throughputPerSlot", "fairSharing"}
)
REPORT_SECONDS = 1.0
#: Phases of a batch that no longer runs on its pool: its backlog is gone.
STOPPED = frozenset({"finalizing", "cancelling", "completed", "failed", "expired", "cancelled"})
#: A round computes from the status the previous round computed only if that is younger than
#: this (the watch's lag, under load seconds); older, the pool's status is the truth (another
#: replica may have led meanwhile).
LATEST_SECONDS = 10.0


def _observe(
    name: str,
    pool: BatchPoolSpec,
    placed: SlotRound,
    scaled: ScaleState,
    backlog: dict[str, int],
    throughput: float,
    tenant_metrics: bool,
) -> None:
    """The round's figures on the operator's metrics."""
    for seconds in placed.run_seconds:
        metrics.SHARD_RUN_SECONDS.labels(name).observe(seconds)
    for tier in TIERS:
        metrics.QUEUE_DEPTH.labels(name, tier).set(sum(1 for q in placed.waiting if q.tier == tier))
    metrics.JOBS_RUNNING.labels(name).set(placed.busy)
    metrics.WARM_SLOTS.labels(name).set(placed.warm)
    metrics.DESIRED_SLOTS.labels(name).set(scaled.desired)
    drain: dict[str, int] = {t: getattr(pool.tiers, t).drain_target_seconds for t in TIERS}
    metrics.observe_pool(name, backlog, drain, pool.max_slots, throughput)
    if placed.tenants is not None:
        metrics.observe_tenants(name, placed.tenants, tenant_metrics)


def _report(
    placed: SlotRound, scaled: ScaleState, backlog: dict[str, int], throughput: float
) -> dict[str, Any]:
    """The pool status the round computed (``PoolScheduler.step`` patches what changed)."""
    wanted: dict[str, Any] = {
        "slotsInUse": placed.busy,
        "warmSlots": placed.warm,
        "desiredSlots": scaled.desired,
        "queueDepth": backlog,
        "throughputPerSlot": f"{throughput:.4f}",
        "scaleDownSince": int(scaled.below_since) if scaled.below_since is not None else None,
    }
    if placed.tenants is not None:
        wanted["fairSharing"] = placed.tenants
    return wanted


def _backlog(batches: list[dict[str, Any]], pool: str) -> dict[str, int]:
    """Requests of the pool's running batches without a result yet, per tier."""
    backlog: dict[str, int] = dict.fromkeys(TIERS, 0)
    for batch in batches:
        status = batch.get("status") or {}
        if status.get("pool") != pool or status.get("status") != "in_progress":
            continue
        spec = batch.get("spec") or {}
        tier = tier_of(spec.get("priority"), spec.get("metadata"))
        counts = status.get("requestCounts") or {}
        left = int(counts.get("total") or 0) - int(counts.get("completed") or 0)
        left -= int(counts.get("failed") or 0)
        backlog[tier if tier in backlog else "standard"] += max(0, left)
    return backlog


def _scale(
    pool: BatchPoolSpec,
    backlog: dict[str, int],
    throughput: float,
    status: dict[str, Any],
    now: float,
) -> tuple[ScaleState, ScaleState]:
    """The previous and the new desired slot count (scale-down damped by the cool-down)."""
    drain: dict[str, int] = {t: getattr(pool.tiers, t).drain_target_seconds for t in TIERS}
    raw = raw_desired_slots(backlog, throughput, drain, pool.min_slots, pool.max_slots)
    previous = ScaleState(
        desired=int(status.get("desiredSlots", pool.min_slots)),
        below_since=status.get("scaleDownSince"),
    )
    return previous, damp(previous, raw, now, pool.scale_down_cooldown_seconds)


@dataclass
class PoolRound:
    """The status patch and Events of one scheduling round."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    quiet: bool = False
    """Only looked: nothing had changed that a round could decide on (status as it was)."""


Batches = list[dict[str, Any]] | Callable[[], list[dict[str, Any]]]
"""A pool's running batches, or how to get them (the index is copied only for a full round)."""
#: A round whose look found nothing changed (no slot's reports, no new work, nothing lost)
#: decides nothing and is skipped, but a full round runs at least this often (scale-down
#: cool-downs, keep-warm marks): with thousands of batches waiting, a full round is the
#: operator's largest cost, and it followed the clock, not change.
QUIET_SECONDS = 10.0
#: A round may also stop at its look when the batches that arrived since the last full round
#: would only wait (:meth:`PoolScheduler.join`), but a full round counts them within this many
#: seconds (the pool's queue depth, its tenants' waiting shards).
JOIN_SECONDS = 2.0


class PoolScheduler:
    """One scheduling round per call, per pool."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = user_cpu,
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.cpu_clock = cpu_clock
        """CPU seconds of the calling thread: a round's cost (``controller.roundcost``)."""
        self.interval = config.reconcile_interval
        self.tenant_metrics = config.tenant_metrics
        self.slots = SlotScheduler(kube, store, config, clock)
        # pool -> (when its last round started, the kicks counted then); kicks counted per pool
        self._rounds: dict[str, tuple[float, int]] = {}
        self._kicks: dict[str, int] = {}
        self._wake: dict[str, asyncio.Event] = {}  # set by a kick; cleared by who waits on it
        # pool -> (the status its last round computed, when): see :meth:`step`
        self._latest: dict[str, tuple[dict[str, Any], float]] = {}
        self._reported: dict[str, float] = {}  # pool -> when its status was last patched
        self._backlogged: set[str] = set()  # pools whose last round left shards waiting
        self._in_round: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._deleted: set[str] = set()  # uids of pools being deleted: no round of them runs
        self._full: dict[str, tuple[float, int, tuple[Any, ...], dict[str, Any]]] = {}
        """pool -> (when its last full round started, the kicks counted then, its look's
        signature, the pool's spec): see :meth:`_quiet`."""
        self._saturated: dict[str, Saturation] = {}
        """pool -> what its last full round proved new work would do: wait (:meth:`join`)."""
        self._joined: set[str] = set()
        """Pools new work joined without a round since their last full round started."""
        self._cost: dict[str, tuple[float, float]] = {}
        """pool -> (when its last full round ended, its cost): see :data:`ROUND_PACE`."""
        # pool -> batch uid -> (when, running_entry): batches this operator accepted whose
        # acceptance its watch has not shown yet (under load the watch lags by seconds)
        self._accepted: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
        self.on_shards_changed: Callable[[str, Priority], None] | None = None
        """Told, after each round, of every batch whose shards it saw change (the work queue:
        a batch is reconciled when its shards change, not polled)."""

    def kick(self, name: str) -> None:
        """A batch of pool ``name`` has shards waiting for their first slot: run a round soon
        instead of at the next interval (the pool timer waits in :meth:`wait_due`)."""
        self._kicks[name] = self._kicks.get(name, 0) + 1
        wake = self._wake.get(name)
        if wake is not None:
            wake.set()

    def join(self, name: str, batch: dict[str, Any]) -> None:
        """``batch`` (:func:`running_entry`) brings pool ``name`` shards to place: a round soon
        (:meth:`kick`), unless the pool's last full round proved they would only wait (its
        :class:`~llmbatch.core.slots.Saturation`: a full pool, its queue waiting at their tier
        or a better one). Then no round runs for them — with 10,000 batches queued a full round
        orders them all, and every acceptance asked for one — until the slots change, and a
        full round counts them within :data:`JOIN_SECONDS`. An expedited batch always kicks."""
        saturated = self._saturated.get(name)
        shards = [work.queued for work in batch_work(name, batch).values()]
        if saturated is not None and shards and all(saturated.holds(s) for s in shards):
            self._joined.add(name)
        else:
            self.kick(name)

    def notice_accepted(self, batch: dict[str, Any]) -> None:
        """This operator just accepted ``batch`` (its new status, not yet patched): its pool
        places the shards at its next check, before the watch shows the batch running."""
        for pool, entry in running_entry(batch).items():
            self._accepted.setdefault(pool, {})[entry["metadata"]["uid"]] = (self.clock(), entry)
            self.join(pool, entry)

    def running_batches(self, name: str, indexed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The pool's running batches for a round: the watch's index (``indexed``), and the
        batches accepted here that it does not show yet (for at most :data:`ACCEPTED_TTL`)."""
        accepted = self._accepted.get(name, {})
        now = self.clock()
        for uid in [u for u, (when, _) in accepted.items() if now - when > ACCEPTED_TTL]:
            del accepted[uid]
        shown = {batch["metadata"]["uid"] for batch in indexed}
        return indexed + [entry for uid, (_, entry) in accepted.items() if uid not in shown]

    def notice_batch(self, body: Mapping[str, Any], *, deleted: bool = False) -> None:
        """Kick the pool of a batch whose status shows shards never placed (:meth:`join`), or
        that stopped running (its backlog is gone: the pool may scale down): the pool decides
        at its next check, not at its next full round. An event that shows the batch accepted
        or later (or deleted) supersedes what :meth:`notice_accepted` kept."""
        status: Mapping[str, Any] = body.get("status") or {}
        uid = (body.get("metadata") or {}).get("uid")
        if uid is not None and (deleted or status.get("status") not in (None, "validating")):
            for accepted in self._accepted.values():
                accepted.pop(uid, None)
        pool, phase = status.get("pool"), status.get("status")
        if deleted or not pool:
            return
        unplaced = phase == "in_progress" and (
            any(
                shard.get("phase") == "Pending" and not shard.get("job")
                for shard in status.get("shards") or []
            )
            or next(shardbook.raw_waiting(status), None) is not None
        )
        if phase in STOPPED:
            self.kick(str(pool))
        elif unplaced:
            for name, entry in running_entry(body).items():
                self.join(name, entry)

    def due(self, name: str) -> bool:
        """Whether pool ``name`` needs a round now: its interval has passed since the last one
        started, a batch kicked it after that round started, or that round left shards
        waiting and :data:`BACKLOG_RECHECK` has passed (a seat a finished shard frees is
        filled within that, not within an interval)."""
        return self._until_due(name) <= 0

    def _until_due(self, name: str) -> float:
        """Seconds until pool ``name`` is due a round unless a batch kicks it first."""
        last = self._rounds.get(name)
        if last is None:
            return 0.0
        ended, cost = self._cost.get(name, (0.0, 0.0))
        paced = ended + min(PACE_LIMIT, ROUND_PACE * cost) - self.clock()
        if self._kicks.get(name, 0) > last[1]:
            return max(0.0, paced)
        wait = self.interval
        if name in self._backlogged:
            wait = min(wait, BACKLOG_RECHECK)
        return max(last[0] + wait - self.clock(), paced)

    async def wait_due(
        self, name: str, limit: float, stop: Callable[[], Awaitable[object]] | None = None
    ) -> bool:
        """Wait up to ``limit`` seconds for pool ``name`` to be due a round (:meth:`due`): at
        once when a batch kicks it, so that a round follows an acceptance by milliseconds
        rather than by a timer period; sooner when ``stop()`` (kopf's ``stopped.wait``: the
        operator is exiting) completes. Whether it is due."""
        wake = self._wake.setdefault(name, asyncio.Event())
        wake.clear()
        wait = min(limit, self._until_due(name))
        if wait > 0:
            waits: list[asyncio.Future[object]] = [asyncio.ensure_future(wake.wait())]
            if stop is not None:
                waits.append(asyncio.ensure_future(stop()))
            try:
                await asyncio.wait(waits, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
        return self.due(name)

    async def step(
        self,
        name: str,
        spec: dict[str, Any],
        status: dict[str, Any],
        uid: str | None,
        batches: Batches,
    ) -> PoolRound:
        """One round: size the pool, settle and place shards on its slots. ``batches`` are the
        pool's running batches (:func:`running_entry`). A pool being deleted gets none. A round
        whose look finds nothing changed since the last full one is quiet (:meth:`_quiet`).

        Rounds can follow each other faster than the watch shows their status patches, so a
        round computes from the status the previous one computed (the scaling state, the
        learned throughput; if younger than :data:`LATEST_SECONDS`) over ``status``. Its patch
        is what differs from ``status`` (a patch that was lost or held back goes with the next
        one) or from what the previous round computed, held back when it only reports and the
        last one went less than :data:`REPORT_SECONDS` ago."""
        async with self._in_round[name]:
            if uid is not None and uid in self._deleted:
                return PoolRound()
            now = self.clock()
            written, computed_at = self._latest.get(name, ({}, -LATEST_SECONDS))
            if now - computed_at >= LATEST_SECONDS:
                written = {}  # older than the watch's lag: the pool's status is the truth
            cost = RoundCost(self.cpu_clock)
            result = await cost.measure(self._step(name, spec, {**status, **written}, uid, batches))
            if not result.quiet:  # its pace (ROUND_PACE): what it took, at most its wall time
                ended = self.clock()
                self._cost[name] = (ended, max(0.0, min(ended - now, cost.seconds)))
            if result.quiet:  # computed nothing new: what the last round computed still holds
                result.status = dict(written)
            else:
                self._latest[name] = (result.status, now)
            # what the pool does not show, and what changed since the last round (its patch
            # may land after this round read the pool: a value that went back is sent again)
            changed = {
                k: v
                for k, v in result.status.items()
                if status.get(k) != v or (k in written and written[k] != v)
            }
            recent = now - self._reported.get(name, -REPORT_SECONDS) < REPORT_SECONDS
            if changed.keys() <= REPORT_FIELDS and recent:
                changed = {}
            if changed:
                self._reported[name] = now
            result.status = changed
            return result

    def _quiet(self, name: str, spec: dict[str, Any], look: Look, kicks: int, now: float) -> bool:
        """Whether the round may stop at its look: the slots show what they showed at the last
        full round (no shard started, ended or was taken), the pool's spec is as it was, no
        batch brought new work but what would only wait (:meth:`join`), nothing is lost, and
        that round is less than :data:`QUIET_SECONDS` old (:data:`JOIN_SECONDS` once work
        joined)."""
        last = self._full.get(name)
        if last is None or look.urgent:
            return False
        when, kicked, signature, specified = last
        young = now - when < (JOIN_SECONDS if name in self._joined else QUIET_SECONDS)
        return signature == look.signature and kicks == kicked and spec == specified and young

    def _saturate(self, name: str, saturation: Saturation | None) -> None:
        """Keep what a full round proved (:meth:`join`). Work that joined while it ran is not
        in it: when the round proved nothing (it placed something), that work kicks now."""
        if saturation is not None:
            self._saturated[name] = saturation
            return
        self._saturated.pop(name, None)
        if name in self._joined:
            self.kick(name)

    def _tell(self, changed: dict[str, Priority]) -> None:
        """Tell the work queue of the batches whose shards this round saw change."""
        if self.on_shards_changed is not None:
            for batch_uid, priority in changed.items():
                self.on_shards_changed(batch_uid, priority)

    async def remove(self, name: str, uid: str | None, pool: BatchPoolSpec) -> int:
        """The pool is being deleted: no round of it starts again, the one under way ends first
        (so no slot starts after this), then its slot Jobs are deleted. Returns how many of its
        slot pods are still exiting; call again until none is."""
        if uid is not None:
            self._deleted.add(uid)
        self._latest.pop(name, None)  # a pool of the same name later starts from its own status
        async with self._in_round[name]:
            left = await self.slots.fleet.remove_pool(name, pool.worker_namespace)
        if not left:
            self._rounds.pop(name, None)
            self._kicks.pop(name, None)
            self._wake.pop(name, None)
            self._reported.pop(name, None)
            self._backlogged.discard(name)
            self._accepted.pop(name, None)
            self._full.pop(name, None)
            self._cost.pop(name, None)
            self._saturated.pop(name, None)
            self._joined.discard(name)
            self.slots.forget_pool(name)
            metrics.forget_pool(name)
        return left

    async def _step(
        self,
        name: str,
        spec: dict[str, Any],
        status: dict[str, Any],
        uid: str | None,
        batches: Batches,
    ) -> PoolRound:
        started = time.perf_counter()
        pool = BatchPoolSpec.model_validate(spec)
        now = self.clock()
        kicks = self._kicks.get(name, 0)
        self._rounds[name] = (now, kicks)
        look = await self.slots.look(name, pool, now)
        if self._quiet(name, spec, look, kicks, now):
            self._tell(look.result.changed)
            return PoolRound(events=look.result.events, quiet=True)
        self._full[name] = (now, kicks, look.signature, spec)
        self._joined.discard(name)
        batches = batches() if callable(batches) else batches
        result = PoolRound()
        throughput = float(Decimal(status.get("throughputPerSlot") or pool.throughput_per_slot))
        backlog = _backlog(batches, name)
        previous, scaled = _scale(pool, backlog, throughput, status, now)
        if scaled.desired != previous.desired:
            result.events.append(
                (
                    "Normal",
                    "DesiredSlots",
                    f"Desired slots {previous.desired} → {scaled.desired} (backlog {backlog})",
                )
            )
        self.slots.ledger.resume(name, status, pool.fair_sharing.usage_half_life_seconds)
        placed = await self.slots.round(name, pool, uid, batches, scaled.desired, now, look)
        self._saturate(name, placed.saturation)
        metrics.POOL_ROUND_SECONDS.labels(name).observe(time.perf_counter() - started)
        result.events += placed.events
        self._tell(placed.changed)
        for ref, reason, message in placed.batch_events:
            involved = {"apiVersion": API_VERSION, "kind": "Batch", **ref}
            await self.kube.post_event(
                involved, reason, message, warning=True, component="llmbatch-operator"
            )
        if placed.waiting:
            self._backlogged.add(name)
        else:
            self._backlogged.discard(name)
        for requests, seconds in placed.learned:
            throughput = learn_throughput(throughput, requests, seconds)
        _observe(name, pool, placed, scaled, backlog, throughput, self.tenant_metrics)
        result.status = _report(placed, scaled, backlog, throughput)
        return result
