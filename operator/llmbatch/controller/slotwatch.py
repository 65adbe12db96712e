"""What a pool round sees of its slots: each slot Job with its heartbeat and assignments, whether
it is alive, lost or has never started, and what about it the platform should hear.

Liveness is timed on the operator's clock over the time it could see (``core.slots.Liveness``):
a store outage or a stalled operator never makes slots look lost. A slot whose pod sends no
heartbeat is looked into (its pod's waiting reason: an image that cannot be pulled, a missing
Secret, a GPU request no node meets), reported as a Warning Event on the pool and on the batches
waiting for it, and removed without blame after ``LLMBATCH_SLOT_START_SECONDS``, counted from
when its Job was last seen suspended (waiting for admission, e.g. by Kueue). A message of a peer
of another version that cannot be parsed is an Event and a metric, never a crash.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.api.slot import Assignment, SlotHeartbeat
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.jobs import LABEL_SLOT, SlotShapes, job_suspended
from llmbatch.controller.kube import Kube
from llmbatch.controller.slotfleet import (
    ANNOTATION_MODEL,
    ANNOTATION_MODEL_REVISION,
    ANNOTATION_REVISION,
    SlotFleet,
)
from llmbatch.controller.slotstate import ObservedSlot, SlotRound, job_ended, pod_not_starting
from llmbatch.core import keys
from llmbatch.core.ids import batch_object_name
from llmbatch.core.scheduling import serving_key
from llmbatch.core.slots import Liveness
from llmbatch.core.workqueue import Priority
from llmbatch.storage.base import ObjectStore
from llmbatch.storage.slotchannel import HeartbeatReading, SlotChannel

log = logging.getLogger("llmbatch.controller.slots")

#: A slot without a heartbeat this long (time seen) has its pod looked into, and again at most
#: this often: long enough for a healthy pod to start its process.
LOOK_INTO_SECONDS = 30.0


def _read_channel(channel: SlotChannel) -> tuple[HeartbeatReading, dict[str, Assignment]]:
    return channel.read_heartbeat(), channel.assignments()


class SlotObserver:
    """Observes the slots of pools, round after round (what it remembers is in memory only: a
    restarted operator starts timing afresh)."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        fleet: SlotFleet,
        io: Callable[..., Awaitable[Any]],
    ) -> None:
        self.kube = kube
        self.store = store
        self.config = config
        self.fleet = fleet
        self._io = io
        self._liveness: dict[str, Liveness] = {}
        self._times: dict[str, tuple[float, float]] = {}
        self._looked_into: dict[str, tuple[float, str | None]] = {}
        """slot -> (when its pod was last looked into, what was found)."""
        self._reported: dict[str, set[str]] = {}
        """slot -> the messages already reported about it (each once)."""
        self._counts: dict[str, dict[str, tuple[int, int, int]]] = {}
        """pool -> assignment key -> (generation, completed, failed) its last look showed."""
        self._channels: dict[str, dict[str, SlotChannel]] = {}
        """pool -> slot prefix -> its channel, kept from look to look: a channel reads only the
        assignments that are new or rewritten since its last look."""

    def liveness(self, pool_name: str) -> Liveness:
        if pool_name not in self._liveness:
            self._liveness[pool_name] = Liveness(
                self.config.slot_lease_seconds, self.config.slot_heartbeat_seconds
            )
        return self._liveness[pool_name]

    def forget(self, slot: str) -> None:
        for live in self._liveness.values():
            live.forget(slot)
        self._times.pop(slot, None)
        self._looked_into.pop(slot, None)
        self._reported.pop(slot, None)

    def forget_pool(self, name: str) -> None:
        self._liveness.pop(name, None)
        self._counts.pop(name, None)
        self._channels.pop(name, None)

    async def observe(
        self, name: str, pool: BatchPoolSpec, now: float, result: SlotRound
    ) -> list[ObservedSlot]:
        """Every slot of the pool that is not being deleted: its Job, heartbeat, assignments;
        the batches whose running shards made progress are touched in ``result``."""
        listed = await self.fleet.jobs(name, pool.worker_namespace, now)
        await self.fleet.sweep_orphans(name, {job["metadata"]["name"] for job in listed}, now)
        jobs = [job for job in listed if not job["metadata"].get("deletionTimestamp")]
        # What a slot of each model looks like now: computed once a round, not once a slot.
        revisions = SlotShapes(self.config, pool)
        kept = self._channels.get(name, {})
        prefixes = [keys.slot_prefix(name, job["metadata"]["name"]) for job in jobs]
        channels = [kept.get(p) or SlotChannel(self.store, p) for p in prefixes]
        self._channels[name] = dict(zip(prefixes, channels, strict=True))
        reads = await asyncio.gather(*(self._io(_read_channel, c) for c in channels))
        self.liveness(name).look(now)  # every channel read: the time until now was seen
        slots = [
            self._observe(name, revisions, job, channel, reading, assignments, now, result)
            for job, channel, (reading, assignments) in zip(jobs, channels, reads, strict=True)
        ]
        await self._look_into_unstarted(pool, slots, now, result)
        await self._look_into_memory(pool, slots, result)
        self._progress(name, slots, result)
        return slots

    def _progress(self, pool_name: str, slots: list[ObservedSlot], result: SlotRound) -> None:
        """Touch the batches whose running shards' counts moved since the last look (their
        progress is folded without a round having to decide anything)."""
        before = self._counts.get(pool_name, {})
        now: dict[str, tuple[int, int, int]] = {}
        for slot in slots:
            beat = slot.heartbeat
            for report in beat.shards if beat is not None else []:
                assignment = slot.assignments.get(report.key)
                if report.state != "running" or assignment is None:
                    continue
                now[report.key] = seen = (report.generation, report.completed, report.failed)
                if before.get(report.key) != seen and report.completed + report.failed:
                    result.touch(assignment.shard.batch_uid, Priority.PROGRESS)
        self._counts[pool_name] = now

    def _observe(
        self,
        pool_name: str,
        revisions: SlotShapes,
        job: dict[str, Any],
        channel: SlotChannel,
        reading: HeartbeatReading,
        assignments: dict[str, Assignment],
        now: float,
        result: SlotRound,
    ) -> ObservedSlot:
        name = job["metadata"]["name"]
        heartbeat = reading.heartbeat
        live = self.liveness(pool_name)
        stamp = None if reading.stamp is None else hash(reading.stamp)
        if live.beat(name, stamp, now) and heartbeat is not None:
            self._count_time(pool_name, name, heartbeat)
        if reading.problem:
            self._unreadable(pool_name, name, "heartbeat", reading.problem, result)
        if heartbeat is not None and heartbeat.unreadable:
            what = f"could not read its assignments {', '.join(heartbeat.unreadable[:5])}"
            self._unreadable(pool_name, name, "assignment", what, result)
        if job_suspended(job):
            live.suspended(name, now)
        lost = job_ended(job)
        exited = lost == "slot Job complete"
        if lost is None and live.lapsed(name, now):
            lost = f"no heartbeat for {self.config.slot_lease_seconds:g} s"
        if lost is None and live.unstarted(name, now) > self.config.slot_start_seconds:
            found = self._looked_into.get(name, (0.0, None))[1]
            lost = f"did not start within {self.config.slot_start_seconds:g} s" + (
                f" ({found})" if found else ""
            )
            metrics.SLOTS_NOT_STARTED.labels(pool_name).inc()
            result.events.append(("Warning", "SlotNotStarted", f"Removed slot {name}: {lost}"))
        annotations = job["metadata"].get("annotations") or {}
        model = annotations.get(ANNOTATION_MODEL, "")
        pinned = annotations.get(ANNOTATION_MODEL_REVISION) or None
        return ObservedSlot(
            name,
            pool_name,
            serving_key(model, pinned),
            channel,
            heartbeat,
            assignments,
            lost,
            exited,
            outdated=annotations.get(ANNOTATION_REVISION) != revisions.of(model, pinned),
            draining=name in self.fleet.draining,
            unreadable=heartbeat is None and reading.problem is not None,
        )

    def _unreadable(
        self, pool_name: str, slot: str, kind: str, problem: str, result: SlotRound
    ) -> None:
        """Report a message that cannot be parsed once (an Event and a metric)."""
        metrics.SLOT_MESSAGES_UNREADABLE.labels(pool_name, kind).inc()
        if self._once(slot, f"{kind}: {problem}"):
            log.warning("slot %s: unreadable %s: %s", slot, kind, problem)
            message = f"Slot {slot}: {problem} (a peer of another version? docs/upgrading.md)"
            result.events.append(("Warning", "UnreadableMessage", message[:1024]))

    def _once(self, slot: str, message: str) -> bool:
        seen = self._reported.setdefault(slot, set())
        if message in seen:
            return False
        seen.add(message)
        return True

    def _count_time(self, pool_name: str, slot: str, heartbeat: SlotHeartbeat) -> None:
        """Busy and idle slot-seconds, from the growth of the heartbeat's running totals."""
        before = self._times.get(slot, (0.0, 0.0))
        self._times[slot] = (heartbeat.busy_seconds, heartbeat.idle_seconds)
        for state, value, old in (
            ("busy", heartbeat.busy_seconds, before[0]),
            ("idle", heartbeat.idle_seconds, before[1]),
        ):
            if value > old:  # a restarted slot process starts its totals again from zero
                metrics.SLOT_SECONDS.labels(pool_name, state).inc(value - old)

    async def _look_into_unstarted(
        self, pool: BatchPoolSpec, slots: list[ObservedSlot], now: float, result: SlotRound
    ) -> None:
        """Why slots without a heartbeat have not started, reported once per reason: a Warning
        Event on the pool, and on every batch with a shard assigned to the slot."""
        live = self.liveness(slots[0].pool) if slots else None
        for slot in slots:
            if live is None or slot.heartbeat is not None or slot.lost is not None:
                continue
            if live.unstarted(slot.name, now) < LOOK_INTO_SECONDS:
                continue
            when, _ = self._looked_into.get(slot.name, (-LOOK_INTO_SECONDS, None))
            if now - when < LOOK_INTO_SECONDS:
                continue
            pods = await self.kube.list_pods(pool.worker_namespace, f"{LABEL_SLOT}={slot.name}")
            found = next((why for pod in pods if (why := pod_not_starting(pod))), None)
            self._looked_into[slot.name] = (now, found)
            if found and self._once(slot.name, found):
                self._report_unstarted(slot, found, result)

    async def _look_into_memory(
        self, pool: BatchPoolSpec, slots: list[ObservedSlot], result: SlotRound
    ) -> None:
        """Whether a failed slot whose last heartbeat named requests with media was killed for
        memory (its pod's container ended ``OOMKilled``): then those requests are blamed, not
        its other runs (``core.oomblame``). Other slots' pods are not read."""
        for slot in slots:
            beat = slot.heartbeat
            failed = slot.lost is not None and slot.lost.startswith("slot Job failed")
            if not failed or beat is None or not any(r.media_in_flight for r in beat.shards):
                continue
            pods = await self.kube.list_pods(pool.worker_namespace, f"{LABEL_SLOT}={slot.name}")
            if any(killed_for_memory(pod) for pod in pods):
                slot.out_of_memory = True
                slot.lost = f"{slot.lost} (OOMKilled)"
                message = f"Slot {slot.name} was killed for memory with requests with media inside"
                result.events.append(("Warning", "SlotOutOfMemory", message))

    @staticmethod
    def _report_unstarted(slot: ObservedSlot, found: str, result: SlotRound) -> None:
        message = f"Slot {slot.name} has not started: {found}"[:1024]
        result.events.append(("Warning", "SlotNotStarting", message))
        refs: dict[str, dict[str, str]] = {}
        for assignment in slot.assignments.values():
            shard = assignment.shard
            refs[shard.batch_uid] = {
                "namespace": keys.namespace_of_shard_prefix(shard.output_prefix),
                "name": batch_object_name(shard.batch_id),
                "uid": shard.batch_uid,
            }
        for ref in refs.values():
            result.batch_events.append((ref, "SlotNotStarting", message))


def killed_for_memory(pod: dict[str, Any]) -> bool:
    """Whether a container of ``pod`` was killed for memory (the kubelet's ``OOMKilled``)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        for state in (container.get("state"), container.get("lastState")):
            if ((state or {}).get("terminated") or {}).get("reason") == "OOMKilled":
                return True
    return False
