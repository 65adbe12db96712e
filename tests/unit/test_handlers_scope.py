"""LLMBATCH_NAMESPACES scopes every Batch handler (kopf itself watches cluster-wide)."""

from __future__ import annotations

import kopf
import pytest

from llmbatch.controller import handlers


def _batch_handlers() -> list[object]:
    registry = kopf.get_default_registry()
    found = []
    for kind in (registry._changing, registry._spawning):
        for handler in kind.get_all_handlers():
            if "batches" in str(handler.selector):
                found.append(handler)
    return found


def test_every_batch_handler_is_filtered_by_the_served_namespaces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch_handlers = _batch_handlers()
    assert len(batch_handlers) >= 5  # timer, create, resume, cancel, delete
    for handler in batch_handlers:
        assert handler.when is not None, handler
    monkeypatch.setattr(handlers, "SERVED", frozenset({"team-a"}))
    assert handlers._served("team-a")
    assert not handlers._served("team-b")
    assert handlers._active(status={"status": "in_progress"}, namespace="team-a")
    assert not handlers._active(status={"status": "in_progress"}, namespace="team-b")
    assert not handlers._active(status={"status": "completed"}, namespace="team-a")
    monkeypatch.setattr(handlers, "SERVED", frozenset())
    assert handlers._served("any")
