"""Delivers the end event of every finished Batch to the BatchWebhooks of its namespace.

Its own task, never inside a Batch reconcile: kopf's ``on.event`` for Batches only calls
:meth:`WebhookDispatcher.notice` (a dict lookup and a heap push), and a scheduler loop starts one
job per due batch, at most ``concurrency`` at once. A job reads the Batch, plans the deliveries
once (the annotation), attempts the due ones, writes the annotation back, and schedules the next
attempt. Nothing lives only in memory: the heap is rebuilt from the annotations that kopf's
initial listing shows after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from llmbatch.api.resources import BatchWebhookSpec, WebhookEventType
from llmbatch.controller import metrics
from llmbatch.controller.config import WebhookConfig
from llmbatch.controller.kube import Kube
from llmbatch.controller.webhooks.check import check, checked
from llmbatch.controller.webhooks.kubeio import WebhookIO
from llmbatch.controller.webhooks.sender import Attempt, Sender
from llmbatch.core import webhooks as rules
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.lifecycle import unix_seconds
from llmbatch.core.netguard import url_problem

log = logging.getLogger(__name__)

LIST_TTL = 1.0
"""Seconds a namespace's BatchWebhook listing is reused when planning."""
Key = tuple[str, str]
"""(namespace, name) of a Batch."""
Outcome = tuple[rules.Delivery, list[tuple[str, str, bool]]]
"""A delivery's new record and the Events (reason, message, warning) to post on the Batch."""


def deliveries_of(body: Mapping[str, Any]) -> rules.Deliveries | None:
    """The deliveries recorded on a Batch (None: none planned yet, or unreadable)."""
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(rules.DELIVERIES_ANNOTATION)
    if not raw:
        return None
    try:
        return rules.Deliveries.model_validate_json(raw)
    except ValidationError:
        log.warning("unreadable %s annotation ignored", rules.DELIVERIES_ANNOTATION)
        return None


class WebhookDispatcher:
    """The delivery scheduler and its bounded pool of jobs."""

    def __init__(
        self, kube: Kube, config: WebhookConfig, clock: Callable[[], float] = time.time
    ) -> None:
        self.io = WebhookIO(kube)
        self.config = config
        self.clock = clock
        self.sender = Sender(config.allowed_networks, config.timeout, config.concurrency)
        self._heap: list[tuple[float, Key]] = []
        self._due: dict[Key, float] = {}
        self._running: set[Key] = set()
        self._checking: set[Key] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[Key, int] = {}
        self._unplanned: set[Key] = set()
        """Batches whose last noticed body had no deliveries planned: while their namespace
        has no BatchWebhook they are done with, without a read of the Batch."""
        self._listed: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(config.concurrency)

    # --- feeding ---------------------------------------------------------------------------

    def notice(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A Batch as a watch event shows it: schedule its deliveries when it has some to do."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        status = (body.get("status") or {}).get("status")
        if deleted or rules.event_type(status) is None:
            self._forget(key)
            return
        recorded = deliveries_of(body)
        if recorded is None:
            if rules.owed(self.config.retry, _ended_at(body, self.clock()), self.clock()):
                self._unplanned.add(key)
                self.schedule(key, self.clock())
            return
        self._unplanned.discard(key)
        due = recorded.next_due()
        if due is None:
            self._forget(key)
        else:
            self._set_pending(key, len(recorded.pending()))
            self.schedule(key, due)

    def notice_webhook(self, body: Mapping[str, Any]) -> None:
        """A BatchWebhook as a watch event shows it: check a generation not checked yet."""
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        if checked(body) or key in self._checking:
            return
        self._checking.add(key)
        task = asyncio.create_task(self._check(key, dict(body)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _check(self, key: Key, body: dict[str, Any]) -> None:
        try:
            async with self._slots:
                await check(self.io, body, self.config.allowed_networks, self.config.timeout)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("BatchWebhook %s/%s: configuration check failed", *key)
        finally:
            self._checking.discard(key)

    def schedule(self, key: Key, due: float) -> None:
        """Look at ``key`` at ``due`` (an earlier wish wins)."""
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, key))
        self._wake.set()

    def _forget(self, key: Key) -> None:
        self._due.pop(key, None)
        self._unplanned.discard(key)
        self._set_pending(key, 0)

    def _set_pending(self, key: Key, count: int) -> None:
        if self._pending.get(key, 0) == count:
            return
        if count:
            self._pending[key] = count
        else:
            del self._pending[key]
        metrics.WEBHOOK_PENDING.set(sum(self._pending.values()))

    # --- the scheduler ---------------------------------------------------------------------

    async def run(self) -> None:
        """Start due jobs until cancelled (run again after a failure: the heap and the jobs
        stay as they were; :meth:`close` ends the jobs)."""
        while True:
            now = self.clock()
            while self._heap and self._heap[0][0] <= now:
                due, key = heapq.heappop(self._heap)
                if self._due.get(key) != due:
                    continue  # superseded by an earlier wish, or forgotten
                del self._due[key]
                if key in self._running:
                    self.schedule(key, now + 1.0)
                    continue
                self._start(key)
            wait = self._heap[0][0] - now if self._heap else None
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def close(self) -> None:
        """Cancel the jobs and checks in flight and close the sender (the operator stops)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.sender.close()

    def _start(self, key: Key) -> None:
        self._running.add(key)
        task = asyncio.create_task(self._job(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _job(self, key: Key) -> None:
        try:
            async with self._slots:
                await self.process(*key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook deliveries of batch %s/%s failed; retrying", *key)
            self.schedule(key, self.clock() + self.config.retry.base)
        finally:
            self._running.discard(key)

    # --- one batch ---------------------------------------------------------------------------

    async def process(self, namespace: str, name: str) -> None:
        """Plan (once) and attempt the due deliveries of one finished Batch."""
        key = (namespace, name)
        if key in self._unplanned and not await self._webhooks(namespace, self.clock()):
            # nothing planned and no endpoint to plan for: the usual finished batch costs no
            # read (an endpoint made later hears only of batches that end after it)
            self._forget(key)
            return
        batch = await self.io.batch(namespace, name)
        kind = rules.event_type(((batch or {}).get("status") or {}).get("status"))
        if batch is None or kind is None:
            self._forget(key)
            return
        now = self.clock()
        deliveries = deliveries_of(batch)
        if deliveries is None and rules.owed(self.config.retry, _ended_at(batch, now), now):
            deliveries = await self._plan(batch, kind, now)
        if deliveries is None:
            return  # no endpoint wants this event, or it is too old
        due = [d for d in deliveries.pending() if d.next_attempt_at <= now]
        outcomes = await asyncio.gather(*(self._deliver(batch, deliveries, d) for d in due))
        updated = {o[0].webhook_id: o[0] for o in outcomes}
        deliveries = deliveries.model_copy(
            update={"deliveries": [updated.get(d.webhook_id, d) for d in deliveries.deliveries]}
        )
        await self.io.save(batch, deliveries, rules.summary(deliveries))
        for _, events in outcomes:
            for reason, message, warning in events:
                await self.io.event(batch, reason, message, warning)
        self._set_pending(key, len(deliveries.pending()))
        following = deliveries.next_due()
        if following is not None:
            self.schedule(key, following)

    async def _plan(
        self, batch: dict[str, Any], kind: WebhookEventType, now: float
    ) -> rules.Deliveries | None:
        meta = batch["metadata"]
        ended_at = _ended_at(batch, now)
        endpoints = []
        for hook in sorted(await self._webhooks(meta["namespace"], now), key=_name):
            try:
                spec = BatchWebhookSpec.model_validate(hook.get("spec") or {})
            except ValidationError:
                continue
            created = unix_seconds(hook["metadata"]["creationTimestamp"])
            if rules.wants(spec.events, kind, created, ended_at):
                endpoints.append((_name(hook), str(hook["metadata"]["uid"])))
        if not endpoints:
            return None
        if len(endpoints) > rules.MAX_ENDPOINTS:
            what = "batch %s/%s: its event goes to the first %d BatchWebhooks only"
            log.warning(what, meta["namespace"], meta["name"], rules.MAX_ENDPOINTS)
        return rules.Deliveries(
            type=kind,
            event_id=rules.event_id(meta["uid"], kind),
            created_at=ended_at,
            deliveries=rules.plan(meta["uid"], kind, endpoints[: rules.MAX_ENDPOINTS], now),
        )

    async def _webhooks(self, namespace: str, now: float) -> list[dict[str, Any]]:
        """The namespace's BatchWebhooks, listed at most once per second (a restart shows every
        recently finished batch at once)."""
        cached = self._listed.get(namespace)
        if cached is None or now - cached[0] >= LIST_TTL:
            cached = self._listed[namespace] = (now, await self.io.webhooks(namespace))
        return cached[1]

    async def _deliver(
        self, batch: dict[str, Any], deliveries: rules.Deliveries, delivery: rules.Delivery
    ) -> Outcome:
        namespace = batch["metadata"]["namespace"]
        hook = await self.io.webhook(namespace, delivery.webhook)
        if hook is None or hook["metadata"].get("uid") != delivery.webhook_uid:
            done = rules.abandoned(delivery, "the BatchWebhook was deleted")
            metrics.WEBHOOK_ENDED.labels("abandoned").inc()
            message = f"{deliveries.type} to {delivery.webhook}: abandoned ({done.last_error})"
            return done, [("WebhookAbandoned", message, True)]
        spec = BatchWebhookSpec.model_validate(hook.get("spec") or {})
        if spec.disabled:
            done = rules.while_disabled(self.config.retry, delivery, self.clock())
            return done, self._ended(deliveries, done, "the BatchWebhook is disabled")
        attempt = await self._attempt(batch, deliveries, delivery, spec)
        metrics.WEBHOOK_DELIVERIES.labels(attempt.outcome).inc()
        metrics.WEBHOOK_ATTEMPT_SECONDS.observe(attempt.seconds)
        now = self.clock()
        if attempt.ok:
            done = rules.after_success(delivery, now)
        else:
            done = rules.after_failure(self.config.retry, delivery, attempt.error or "", now)
        try:  # the counters are for people: never lose the delivery's record over them
            await self.io.record_attempt(
                namespace, delivery.webhook, done, attempt.outcome, attempt.error
            )
        except Exception:
            log.warning("BatchWebhook %s/%s: status not updated", namespace, delivery.webhook)
        return done, self._attempt_events(deliveries, done, attempt)

    async def _attempt(
        self,
        batch: dict[str, Any],
        deliveries: rules.Deliveries,
        delivery: rules.Delivery,
        spec: BatchWebhookSpec,
    ) -> Attempt:
        namespace, name = batch["metadata"]["namespace"], batch["metadata"]["name"]
        try:
            problem = url_problem(spec.url)
            if problem:
                raise ValueError(problem)
            key = rules.signing_key(await self.io.secret_value(namespace, spec.secret_ref))
        except ValueError as exc:
            return Attempt(False, "config_error", str(exc), 0.0)
        uid = batch["metadata"]["uid"]
        event = rules.build_event(
            batch_id_from_name(name), uid, deliveries.type, deliveries.created_at
        )
        body = event.body()
        headers = rules.signed_headers(key, delivery.webhook_id, int(self.clock()), body)
        return await self.sender.post(spec.url, headers, body)

    def _attempt_events(
        self, deliveries: rules.Deliveries, done: rules.Delivery, attempt: Attempt
    ) -> list[tuple[str, str, bool]]:
        head = f"{deliveries.type} to {done.webhook} (webhook-id {done.webhook_id})"
        if attempt.ok:
            metrics.WEBHOOK_ENDED.labels("delivered").inc()
            return [("WebhookDelivered", f"{head}: delivered at attempt {done.attempts}", False)]
        if done.state == "GivenUp":
            return self._ended(deliveries, done, attempt.error or "")
        wait = round(done.next_attempt_at - (done.last_attempt_at or 0))
        message = f"{head}: attempt {done.attempts} failed ({attempt.error}); next in {wait}s"
        return [("WebhookAttemptFailed", message, True)]

    def _ended(
        self, deliveries: rules.Deliveries, done: rules.Delivery, why: str
    ) -> list[tuple[str, str, bool]]:
        if done.state != "GivenUp":
            return []
        metrics.WEBHOOK_ENDED.labels("given_up").inc()
        message = (
            f"{deliveries.type} to {done.webhook} (webhook-id {done.webhook_id}): given up after "
            f"{done.attempts} attempt(s): {why}"
        )
        return [("WebhookGivenUp", message, True)]


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _ended_at(batch: Mapping[str, Any], otherwise: float) -> int:
    """Unix seconds of the batch's terminal status (``completedAt``, ``cancelledAt``, ...)."""
    status = batch.get("status") or {}
    return int(status.get(f"{status.get('status')}At") or otherwise)
