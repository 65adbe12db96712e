"""LLMBATCH_NAMESPACES scopes every Batch handler (kopf itself watches cluster-wide), and no
Batch has a timer of its own: batches are reconciled by the work queue as they change (#30)."""

from __future__ import annotations

import kopf
import pytest

from llmbatch.controller import handlers


def _batch_handlers(*kinds: str) -> list[object]:
    registry = kopf.get_default_registry()
    found = []
    for kind in kinds:
        for handler in getattr(registry, kind).get_all_handlers():
            if "batches" in str(handler.selector) and "batchpools" not in str(handler.selector):
                found.append(handler)
    return found


def test_every_batch_handler_is_filtered_by_the_served_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch_handlers = _batch_handlers("_changing", "_watching", "_indexing")
    assert len(batch_handlers) >= 1  # the watch's events
    for handler in batch_handlers:
        assert handler.when is not None, handler
    monkeypatch.setattr(handlers, "SERVED", frozenset({"team-a"}))
    assert handlers._served("team-a")
    assert not handlers._served("team-b")
    monkeypatch.setattr(handlers, "SERVED", frozenset())
    assert handlers._served("any")


def test_no_kopf_index_on_batches() -> None:
    """kopf holds every handler until each object of an indexed kind is indexed, at a cost
    quadratic in the objects listed: a restart with 5,000 Batches served nothing for minutes.
    The running batches are indexed by the operator (``controller.runningindex``)."""
    assert _batch_handlers("_indexing") == []


def test_no_batch_has_a_timer_or_a_daemon() -> None:
    """A timer per batch makes the operator's work grow with the batches that exist."""
    assert _batch_handlers("_spawning") == []


def test_a_dead_replica_holds_off_its_replacement_for_the_peering_lifetime_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf pauses an operator while another live peer of its priority is listed; a replica
    killed without leaving stays listed for its lifetime, kopf's default 60 s (#30: restart
    -> serving within 60 s). Ours is 20 s, never under 10 s (keep-alives go 5-10 s sooner)."""
    from llmbatch.controller.config import OperatorConfig

    monkeypatch.setenv("LLMBATCH_STORE_URI", "file:///tmp/unused")
    monkeypatch.delenv("LLMBATCH_PEERING_LIFETIME", raising=False)
    assert OperatorConfig.from_env().peering_lifetime == 20
    monkeypatch.setenv("LLMBATCH_PEERING_LIFETIME", "45")
    assert OperatorConfig.from_env().peering_lifetime == 45
    monkeypatch.setenv("LLMBATCH_PEERING_LIFETIME", "3")
    assert OperatorConfig.from_env().peering_lifetime == 10


def test_no_kopf_changing_handler_on_batches() -> None:
    """A changing handler (create/update/delete) makes kopf write on every Batch: its
    finalizer and its last-handled-configuration annotation, two PATCHes per batch at
    acceptance. The operator holds its own finalizer (``BATCH_FINALIZER``) and cleans up
    through the work queue."""
    assert _batch_handlers("_changing") == []


def test_kopf_builds_no_essence_of_a_batch_and_keeps_a_pools() -> None:
    """kopf deep-copies an object's essence at every watch event to diff it; nothing reads a
    Batch's (no changing handler: the test above), a BatchPool's deletion handler needs its."""
    storage = handlers.WatchOnlyBatches(prefix="llmbatch.io", key="last-handled-configuration")
    meta = {"name": "x", "annotations": {"keep": "me"}}
    batch = kopf.Body({"kind": "Batch", "metadata": meta, "spec": {"endpoint": "/v1/x"}})
    pool = kopf.Body({"kind": "BatchPool", "metadata": meta, "spec": {"maxSlots": 2}})
    assert storage.build(body=batch) == {}
    assert storage.build(body=pool)["spec"] == {"maxSlots": 2}
