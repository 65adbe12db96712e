"""A pool's slot Jobs over their lives: started (with their first shards, or empty to keep
``minSlots`` warm), kept warm, retired when the pool changed under them, drained when surplus,
removed when lost. The slot scheduler (:mod:`llmbatch.controller.slots`) decides where shards
go; this module only changes which slots exist.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llmbatch.api.resources import BatchPoolSpec, PoolModel
from llmbatch.api.shard import ModelRef
from llmbatch.api.slot import SlotSpec
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import build_slot_job, engine_spec, slot_revision, slot_selector
from llmbatch.controller.kube import Kube
from llmbatch.controller.slotstate import (
    ObservedSlot,
    SlotRound,
    Work,
    new_slot_name,
)
from llmbatch.core import keys
from llmbatch.core.scheduling import revision_to_serve
from llmbatch.core.slots import Placement
from llmbatch.storage.base import ObjectStore, delete_under
from llmbatch.storage.slotchannel import clear_pool_channels

ANNOTATION_MODEL = "llmbatch.io/model"
ANNOTATION_REVISION = "llmbatch.io/slot-revision"
#: The model revision a slot serves: the one its shards' batches pinned ("": unpinned).
ANNOTATION_MODEL_REVISION = "llmbatch.io/model-revision"
API_GROUP_VERSION = "llmbatch.io/v1alpha1"

Assign = Callable[[str, str, Work, float], Awaitable[None]]
"""Lease a shard to a slot and write its assignment: (pool, slot, work, now)."""

log = logging.getLogger(__name__)

#: How often a pool's slot channels are compared with its slot Jobs (orphans removed).
ORPHAN_SWEEP_SECONDS = 300.0


class SlotFleet:
    """Creates, keeps, retires, drains and removes the slot Jobs of pools."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        forget: Callable[[str], None],
    ) -> None:
        self.kube = kube
        self.store = store
        self.config = config
        self.forget = forget
        """Drop what the scheduler remembers of a removed slot (its heartbeat timing)."""
        self._marks: dict[str, bool] = {}
        """Slot -> whether its keep-warm mark is in the store, as this process last wrote or
        read it (a slot not in it is read once: a restarted operator finds the marks its
        predecessor left, and removes the ones no slot should keep)."""
        self.draining: set[str] = set()
        """Slots this process asked to drain: they take no new shard from then on, before
        their heartbeat says they drain."""
        self._listings: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        """pool -> (when listed, its slot Jobs): see :meth:`jobs`."""
        self._changes: dict[str, int] = {}
        """pool -> how often this operator created or deleted one of its slot Jobs."""
        self._relisting: dict[str, asyncio.Task[None]] = {}
        self._orphans: dict[str, tuple[float, set[str]]] = {}
        """pool -> (when its channels were last swept, the channels found without a Job)."""

    async def jobs(self, pool_name: str, namespace: str, now: float) -> list[dict[str, Any]]:
        """The pool's slot Jobs, listed after this operator last created or deleted one.

        A listing is reused for ``slot_job_listing_seconds``, then for half as long again while
        it is listed anew in the background; older, it is listed before the round goes on.
        Under a burst, rounds follow each other back to back and on a busy API server the
        listing was their slowest call (0.2-0.9 s of a 0.5-1 s round); when rounds are an
        interval apart each lists. A slot Job that failed or that someone else deleted is seen
        up to 1.5 times that later."""
        fresh = self.config.slot_job_listing_seconds
        listed = self._listings.get(pool_name)
        age = -1.0 if listed is None else now - listed[0]
        if listed is None or not 0 <= age < 1.5 * fresh:
            return await self._list(pool_name, namespace, now)
        if age >= fresh and pool_name not in self._relisting:
            self._relisting[pool_name] = asyncio.create_task(
                self._relist(pool_name, namespace, now)
            )
        return listed[1]

    async def _list(self, pool_name: str, namespace: str, now: float) -> list[dict[str, Any]]:
        changes = self._changes.get(pool_name, 0)
        jobs = await self.kube.list_jobs(namespace, slot_selector(pool_name))
        if self._changes.get(pool_name, 0) == changes:  # else it may miss that change
            self._listings[pool_name] = (now, jobs)
        return jobs

    async def _relist(self, pool_name: str, namespace: str, now: float) -> None:
        try:
            await self._list(pool_name, namespace, now)
        except Exception as exc:  # the next round lists again; it reports what fails
            log.warning("listing the slot Jobs of pool %s failed: %s", pool_name, exc)
        finally:
            self._relisting.pop(pool_name, None)

    def _changed(self, pool_name: str) -> None:
        """This operator creates or deletes a slot Job of the pool: list it again first."""
        self._changes[pool_name] = self._changes.get(pool_name, 0) + 1
        self._listings.pop(pool_name, None)

    def _forget(self, slot: str) -> None:
        self.forget(slot)
        self._marks.pop(slot, None)
        self.draining.discard(slot)

    async def sweep_orphans(self, pool_name: str, jobs: set[str], now: float) -> int:
        """Remove the channels of slots that have no Job — left behind when an operator died
        between deleting a Job and its channel, or when someone else deleted the Job — at most
        every :data:`ORPHAN_SWEEP_SECONDS`. A channel counts as an orphan only when it had no
        Job at two sweeps in a row: a new slot's channel is written just before its Job is
        created. How many channels were removed."""
        last = self._orphans.get(pool_name)
        if last is not None and now - last[0] < ORPHAN_SWEEP_SECONDS:
            return 0
        prefix = keys.pool_slots_prefix(pool_name)
        listed = await asyncio.to_thread(lambda: list(self.store.list(prefix)))
        channels = {info.key[len(prefix) :].split("/", 1)[0] for info in listed}
        without_job = channels - jobs
        removed = without_job & (last[1] if last is not None else set())
        for slot in sorted(removed):
            log.info("pool %s: removing the channel of slot %s, which has no Job", pool_name, slot)
            await asyncio.to_thread(
                delete_under, self.store, keys.slot_prefix(pool_name, slot) + "/"
            )
            self._forget(slot)
        self._orphans[pool_name] = (now, without_job - removed)
        return len(removed)

    async def keep_warm(self, pool: BatchPoolSpec, live: list[ObservedSlot]) -> set[str]:
        """Mark ``minSlots`` open slots (loaded ones first) to stay up past their idle time, and
        unmark the rest; the marked ones are never scaled down."""
        open_slots = sorted(
            (s for s in live if s.open),
            key=lambda s: (s.heartbeat is None or s.heartbeat.state != "ready", s.name),
        )
        kept = {s.name for s in open_slots[: pool.min_slots]}
        for slot in live:
            want = slot.name in kept
            if slot.name not in self._marks:
                self._marks[slot.name] = await asyncio.to_thread(slot.channel.keep_requested)
            if want != self._marks[slot.name]:
                await asyncio.to_thread(slot.channel.keep_warm, want)
                self._marks[slot.name] = want
        return kept

    async def prestart(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        live: list[ObservedSlot],
        placement: Placement,
        now: float,
        assign: Assign,
        result: SlotRound,
    ) -> int:
        """Start empty slots of the pool's first model until ``minSlots`` are open, so the
        first batch finds a loaded engine."""
        open_count = sum(1 for s in live if s.open) + len(placement.new_slots)
        missing = min(pool.min_slots, pool.max_slots) - open_count
        for _ in range(max(0, missing)):
            slot = await self.start(pool_name, pool, pool_uid, [], now, assign, pool.models[0].name)
            result.events.append(("Normal", "SlotStarted", f"Started slot {slot} (minSlots)"))
        return max(0, missing)

    async def start(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        group: list[Work],
        now: float,
        assign: Assign,
        model_name: str | None = None,
    ) -> str:
        """Write a new slot's spec and first assignments, then create its Job (the model of
        its shards, or ``model_name`` for an empty one)."""
        slot = new_slot_name(pool_name)
        queued = group[0].queued if group else None
        model_name = queued.model_name if queued else model_name
        model = next((m for m in pool.models if m.name == model_name), None)
        if model is None:  # the round withdraws the shards of a model removed from the pool
            raise LookupError(f"pool {pool_name} does not serve model {model_name!r}")
        # The revision its shards pinned (what it is matched on; none: unpinned work, accepted
        # before revisions were recorded); an empty slot: the pool's current one (what new
        # batches pin).
        pinned = queued.revision if queued else model.revision
        spec = self._slot_spec(pool_name, pool, slot, model, pinned)
        spec_key = f"{spec.channel_prefix}/spec.json"
        await asyncio.to_thread(self.store.put, spec_key, spec.model_dump_json().encode())
        for work in group:
            await assign(pool_name, slot, work, now)
        job = self._slot_job(pool_name, pool, pool_uid, slot, spec_key, model.name, pinned)
        self._changed(pool_name)
        await self.kube.create_or_adopt_job(job)
        metrics.SLOT_STARTS.labels(pool_name).inc()
        return slot

    def _slot_spec(
        self, pool_name: str, pool: BatchPoolSpec, slot: str, model: PoolModel, pinned: str | None
    ) -> SlotSpec:
        """What the slot's executor loads and how it talks to the scheduler."""
        return SlotSpec(
            pool=pool_name,
            slot=slot,
            store=self.config.executor_store_uri,
            channel_prefix=keys.slot_prefix(pool_name, slot),
            model=ModelRef(
                name=model.name,
                path=model.source,
                revision=revision_to_serve(pinned, model.revision),
            ),
            engine=engine_spec(self.config, pool),
            # Unset in the pool: the slot sizes it from its loaded engine (heartbeat.concurrency).
            concurrency=pool.slot_concurrency,
            idle_seconds=pool.idle_seconds,
            heartbeat_seconds=self.config.slot_heartbeat_seconds,
            poll_seconds=self.config.slot_poll_seconds,
        )

    def _slot_job(
        self,
        pool_name: str,
        pool: BatchPoolSpec,
        pool_uid: str | None,
        slot: str,
        spec_key: str,
        model: str,
        pinned: str | None,
    ) -> dict[str, Any]:
        """The slot's Job, annotated with what it serves and owned by its pool."""
        job = build_slot_job(
            config=self.config, pool_name=pool_name, pool=pool, slot=slot, spec_key=spec_key
        )
        job["metadata"]["annotations"] = {  # over the pool's podTemplate annotations
            **job["metadata"].get("annotations", {}),
            ANNOTATION_MODEL: model,
            ANNOTATION_MODEL_REVISION: pinned or "",
            ANNOTATION_REVISION: slot_revision(self.config, pool, model, pinned) or "",
        }
        if pool_uid:
            job["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": API_GROUP_VERSION,
                    "kind": "BatchPool",
                    "name": pool_name,
                    "uid": pool_uid,
                }
            ]
        return job

    async def remove(self, namespace: str, slot: ObservedSlot) -> None:
        """Delete the slot's Job (a hung process with it) and its channel."""
        self._forget(slot.name)
        self._changed(slot.pool)
        await self.kube.delete_job(namespace, slot.name)
        await asyncio.to_thread(slot.channel.clear)

    async def remove_pool(self, pool_name: str, namespace: str) -> int:
        """Delete every slot Job of a deleted pool; how many of its slot pods are still there
        (each executor takes SIGTERM, commits and exits). Once none is, the pool's channels go
        too: a slot that is still exiting may write its last heartbeat."""
        selector = slot_selector(pool_name)
        self._changed(pool_name)
        for job in await self.kube.list_jobs(namespace, selector):
            slot = job["metadata"]["name"]
            self._forget(slot)
            if not job["metadata"].get("deletionTimestamp"):
                await self.kube.delete_job(namespace, slot)
        left = len(await self.kube.list_pods(namespace, selector))
        if not left:
            await asyncio.to_thread(clear_pool_channels, self.store, pool_name)
        return left

    async def retire(self, namespace: str, slot: ObservedSlot, result: SlotRound) -> None:
        """A slot started before its pool was edited takes no new shard. What it was given but
        has not started goes back to the queue now; the shards it runs finish there (nothing is
        interrupted) and it drains; one that runs nothing is removed at once. New slots of the
        new spec take the work."""
        for key in slot.queued():
            await asyncio.to_thread(slot.channel.revoke, key)
        if not slot.running():
            await self.remove(namespace, slot)
            result.events.append(
                ("Normal", "SlotOutdated", f"Removed slot {slot.name}: the pool changed")
            )
            return
        if slot.heartbeat is not None and slot.heartbeat.state in ("draining", "exited"):
            return
        await self._drain(
            slot,
            "SlotOutdated",
            f"Draining slot {slot.name}: the pool changed since it started; it finishes its "
            "running shards, new ones go to slots of the new spec",
            result,
        )

    async def _drain(
        self, slot: ObservedSlot, reason: str, message: str, result: SlotRound
    ) -> None:
        """Ask the slot to drain, once (an Event the first time); it takes no new shard."""
        self.draining.add(slot.name)
        if await asyncio.to_thread(slot.channel.drain_requested):
            return
        await asyncio.to_thread(slot.channel.request_drain)
        result.events.append(("Normal", reason, message))

    async def scale_down(
        self,
        namespace: str,
        slots: list[ObservedSlot],
        busy: set[str],
        desired: int,
        waiting: set[str],
        kept: set[str],
        result: SlotRound,
    ) -> None:
        """More open slots than the autoscaler wants (its cool-down has passed), or idle slots
        of a model while shards of another wait for room: drain idle ones, never the ``kept``
        (minSlots). A draining slot takes no new shard and exits; busy slots finish their
        work."""
        open_slots = [s for s in slots if s.open]
        idle = sorted((s for s in open_slots if s.name not in busy), key=lambda s: s.name)
        idle = [s for s in idle if s.name not in kept]
        # Never an idle slot of a model whose shards wait: it gets one next round (draining it
        # would start another slot, and load the model again, for the same work).
        idle = [s for s in idle if s.model not in waiting]
        surplus = idle[: max(0, len(open_slots) - desired)]
        if waiting:  # a slot serves one model: an idle one of another model is in the way
            surplus += [s for s in idle if s not in surplus]
        for slot in surplus:
            if slot.heartbeat is None and not slot.assignments:
                # Never started (its pod waits for a node): nothing to drain, just remove it.
                await self.remove(namespace, slot)
                result.events.append(
                    ("Normal", "SlotRemoved", f"Removed unstarted slot {slot.name}")
                )
                continue
            await self._drain(slot, "SlotDrained", f"Draining idle slot {slot.name}", result)
