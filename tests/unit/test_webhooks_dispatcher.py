"""What the webhook dispatcher schedules from the Batches kopf shows it (no API calls here: the
deliveries themselves run against the real control plane in tests/integration/test_webhooks.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from llmbatch.controller.config import WebhookConfig
from llmbatch.controller.webhooks import WebhookDispatcher
from llmbatch.core import webhooks as rules

NOW = 1_800_000_000.0


def batch(status: str, ended: float = NOW, deliveries: rules.Deliveries | None = None) -> Any:
    annotations = {rules.DELIVERIES_ANNOTATION: deliveries.to_annotation()} if deliveries else {}
    return {
        "metadata": {"namespace": "t", "name": "batch-1", "uid": "u", "annotations": annotations},
        "status": {"status": status, f"{status}At": int(ended)},
    }


def dispatcher() -> WebhookDispatcher:
    return WebhookDispatcher(kube=None, config=WebhookConfig(), clock=lambda: NOW)  # type: ignore[arg-type]


def recorded(*records: rules.Delivery) -> rules.Deliveries:
    return rules.Deliveries(
        type="batch.completed", event_id="evt_1", created_at=int(NOW), deliveries=list(records)
    )


def test_a_batch_that_just_ended_is_due_now_and_a_running_one_is_not() -> None:
    d = dispatcher()
    d.notice(batch("in_progress"))
    assert d._due == {}
    d.notice(batch("completed"))
    assert d._due == {("t", "batch-1"): NOW}
    d.notice(batch("completed"), deleted=True)
    assert d._due == {}


def test_an_event_older_than_the_retry_period_is_not_started() -> None:
    d = dispatcher()
    d.notice(batch("failed", ended=NOW - 2 * 86400))
    assert d._due == {}


def test_recorded_deliveries_are_due_at_their_next_attempt() -> None:
    (pending,) = rules.plan("u", "batch.completed", [("hook", "h1")], now=NOW - 10)
    retry = rules.after_failure(rules.RetryPolicy(), pending, "HTTP 500", NOW - 10)
    d = dispatcher()
    d.notice(batch("completed", deliveries=recorded(retry)))
    assert d._due == {("t", "batch-1"): retry.next_attempt_at}
    d.notice(batch("completed", deliveries=recorded(rules.after_success(retry, NOW))))
    assert d._due == {}  # delivered: nothing more to do


class CountingIO:
    """The dispatcher's Kubernetes side: the namespace's BatchWebhooks, reads of the Batch
    counted."""

    def __init__(self, hooks: list[dict[str, Any]]) -> None:
        self.hooks = hooks
        self.batch_reads = 0

    async def webhooks(self, namespace: str) -> list[dict[str, Any]]:
        return self.hooks

    async def batch(self, namespace: str, name: str) -> Any:
        self.batch_reads += 1
        return None  # deleted meanwhile: nothing more to do either way


def test_a_finished_batch_with_no_endpoint_in_its_namespace_costs_no_read() -> None:
    d = dispatcher()
    d.io = CountingIO([])  # type: ignore[assignment]
    d.notice(batch("completed"))
    asyncio.run(d.process("t", "batch-1"))
    assert d.io.batch_reads == 0  # type: ignore[attr-defined]
    assert d._due == {}
    assert not d._unplanned
    # with an endpoint there, the Batch is read (its deliveries planned from what it is now)
    d = dispatcher()
    d.io = CountingIO([{"metadata": {"name": "hook"}}])  # type: ignore[assignment]
    d.notice(batch("completed"))
    asyncio.run(d.process("t", "batch-1"))
    assert d.io.batch_reads == 1  # type: ignore[attr-defined]


def test_recorded_deliveries_are_read_whatever_the_endpoints() -> None:
    (pending,) = rules.plan("u", "batch.completed", [("hook", "h1")], now=NOW - 10)
    d = dispatcher()
    d.io = CountingIO([])  # type: ignore[assignment]
    d.notice(batch("completed", deliveries=recorded(pending)))
    asyncio.run(d.process("t", "batch-1"))
    assert d.io.batch_reads == 1  # type: ignore[attr-defined]
