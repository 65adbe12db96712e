"""CR → OpenAI object mapping and list pagination (pure functions of llmbatch.gateway.mapping)."""

from __future__ import annotations

from typing import Any

import openai.types
import pytest

from llmbatch.gateway.mapping import (
    ANNOTATION_CANCEL_AT,
    ANNOTATION_CREATED_NS,
    CursorNotFound,
    batch_sort_key,
    batch_to_openai,
    file_to_openai,
    list_page,
    paginate,
)


def _batch(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {
            "name": "batch-0123456789abcdef01234567",
            "namespace": "team-a",
            "creationTimestamp": "2026-11-29T12:00:00Z",
            "annotations": {ANNOTATION_CREATED_NS: str(1795953599 * 10**9 + 5)},
        },
        "spec": {
            "endpoint": "/v1/chat/completions",
            "inputFileID": "file-" + "a" * 32,
            "completionWindow": "24h",
            "priority": "standard",
            **spec,
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_before_the_operator_writes_status_the_batch_is_validating() -> None:
    batch = batch_to_openai(_batch())
    assert batch.id == "batch_0123456789abcdef01234567"
    assert batch.status == "validating"
    assert batch.created_at == 1795953600
    assert batch.expires_at == 1795953600 + 86400
    assert batch.request_counts.model_dump() == {"total": 0, "completed": 0, "failed": 0}
    assert batch.usage is None
    assert batch.errors is None
    sdk = openai.types.Batch.model_validate(batch.model_dump(mode="json"))
    assert sdk.status == "validating"


def test_completed_status_maps_every_field() -> None:
    status = {
        "status": "completed",
        "model": "smollm2",
        "createdAt": 100,
        "inProgressAt": 110,
        "expiresAt": 86500,
        "finalizingAt": 120,
        "completedAt": 130,
        "requestCounts": {"total": 3, "completed": 2, "failed": 1},
        "usage": {
            "inputTokens": 10,
            "cachedTokens": 4,
            "outputTokens": 20,
            "reasoningTokens": 3,
            "totalTokens": 30,
        },
        "outputFileID": "file-" + "b" * 32,
        "errorFileID": "file-" + "c" * 32,
        "shards": [],
        "pool": "p",
    }
    batch = batch_to_openai(_batch(status, metadata={"run": "1"}))
    wire = batch.model_dump(mode="json")
    assert wire["status"] == "completed"
    assert wire["created_at"] == 100
    assert wire["completed_at"] == 130
    assert wire["in_progress_at"] == 110
    assert wire["finalizing_at"] == 120
    assert wire["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert wire["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 30,
    }
    assert wire["output_file_id"] == "file-" + "b" * 32
    assert wire["error_file_id"] == "file-" + "c" * 32
    assert wire["metadata"] == {"run": "1"}
    assert wire["model"] == "smollm2"
    assert "shards" not in wire
    assert "pool" not in wire
    sdk = openai.types.Batch.model_validate(wire)
    assert sdk.usage is not None
    assert sdk.usage.input_tokens_details.cached_tokens == 4


def test_failed_status_carries_errors_with_lines() -> None:
    status = {
        "status": "failed",
        "failedAt": 5,
        "errors": [{"code": "invalid_json_line", "message": "bad", "param": None, "line": 3}],
    }
    batch = batch_to_openai(_batch(status))
    assert batch.errors is not None
    assert batch.errors.model_dump(mode="json") == {
        "object": "list",
        "data": [{"code": "invalid_json_line", "message": "bad", "param": None, "line": 3}],
    }
    assert batch.failed_at == 5


def test_cancel_requested_reads_cancelling_until_the_operator_acts() -> None:
    obj = _batch({"status": "in_progress", "createdAt": 100}, cancel=True)
    obj["metadata"]["annotations"][ANNOTATION_CANCEL_AT] = "150"
    batch = batch_to_openai(obj)
    assert batch.status == "cancelling"
    assert batch.cancelling_at == 150
    # once terminal, the operator's status wins
    obj["status"] = {"status": "cancelled", "cancellingAt": 151, "cancelledAt": 160}
    batch = batch_to_openai(obj)
    assert batch.status == "cancelled"
    assert batch.cancelling_at == 151


def test_flex_is_flex_on_the_wire_with_a_72h_window() -> None:
    batch = batch_to_openai(_batch(priority="flex", metadata={"tier": "flex"}))
    assert batch.priority == "flex"
    assert batch.expires_at == batch.created_at + 72 * 3600
    assert batch.metadata == {"tier": "flex"}
    assert batch_to_openai(_batch(priority="expedited")).priority == "expedited"


def test_a_flex_batch_with_its_own_window_expires_when_the_operator_says() -> None:
    """kubectl users may give a flex batch another window: the operator keeps it (core.tiers),
    so the shown expiry does too; only the default 24 h becomes 72 h."""
    batch = batch_to_openai(_batch(priority="flex", completionWindow="90m"))
    assert batch.expires_at == batch.created_at + 90 * 60


def test_unknown_phase_reads_validating_and_inline_batches_have_empty_input() -> None:
    obj = _batch({"status": "weird"})
    del obj["spec"]["inputFileID"]
    batch = batch_to_openai(obj)
    assert batch.status == "validating"
    assert batch.input_file_id == ""


def test_file_mapping_inputs_and_outputs() -> None:
    spec = {
        "id": "file-" + "d" * 32,
        "bytes": 12,
        "filename": "requests.jsonl",
        "purpose": "batch",
        "storageKey": "files/team-a/x",
        "createdAt": 1000,
    }
    f = file_to_openai({"metadata": {"name": spec["id"]}, "spec": spec})
    assert f.model_dump(mode="json") | {} == {
        "id": spec["id"],
        "object": "file",
        "bytes": 12,
        "created_at": 1000,
        "filename": "requests.jsonl",
        "purpose": "batch",
        "status": "processed",
        "expires_at": 1000 + 86400,
        "status_details": None,
    }
    out = file_to_openai(
        {"metadata": {}, "spec": {**spec, "purpose": "batch_output", "expiresAt": 5000}}
    )
    assert out.purpose == "batch_output"
    assert out.expires_at == 5000
    openai.types.FileObject.model_validate(out.model_dump(mode="json"))


def test_sort_key_uses_nanosecond_annotation_then_creation_time() -> None:
    a, b = _batch(), _batch()
    b["metadata"]["annotations"][ANNOTATION_CREATED_NS] = str(1795953599 * 10**9 + 6)
    assert batch_sort_key(b) > batch_sort_key(a)
    c = _batch()
    del c["metadata"]["annotations"]
    assert batch_sort_key(c)[0] == 1795953600 * 10**9 + 999_999_999


@pytest.mark.parametrize(
    ("after", "limit", "expected", "more"),
    [
        (None, 3, ["a", "b", "c"], True),
        ("c", 3, ["d", "e", "f"], True),
        ("f", 3, ["g"], False),
        ("g", 3, [], False),
        (None, 7, list("abcdefg"), False),
        (None, 100, list("abcdefg"), False),
    ],
)
def test_paginate(after: str | None, limit: int, expected: list[str], more: bool) -> None:
    items = list("abcdefg")
    page, has_more = paginate(items, lambda x: x, after, limit)
    assert page == expected
    assert has_more is more
    envelope = list_page(page, has_more, lambda x: x)
    assert envelope.first_id == (expected[0] if expected else None)
    assert envelope.last_id == (expected[-1] if expected else None)


def test_paginate_unknown_cursor() -> None:
    with pytest.raises(CursorNotFound):
        paginate(["a"], lambda x: x, "zz", 10)


def test_the_wire_model_is_the_model_id_and_the_pinned_revision_a_field_of_its_own() -> None:
    asked = _batch(model="smollm2")
    assert batch_to_openai(asked).model == "smollm2"  # before acceptance: as asked
    assert batch_to_openai(asked).model_revision is None
    accepted = _batch(status={"status": "in_progress", "model": "smollm2"})
    assert batch_to_openai(accepted).model == "smollm2"  # no revision pinned
    pinned = _batch(
        status={"status": "completed", "model": "smollm2", "modelRevision": "0.1.2-fp32-r2"}
    )
    wire = batch_to_openai(pinned)
    assert (wire.model, wire.model_revision) == ("smollm2", "0.1.2-fp32-r2")


@pytest.mark.parametrize(
    ("spec", "priority"),
    [
        ({}, "standard"),
        ({"priority": "expedited"}, "expedited"),
        ({"priority": "flex"}, "flex"),  # as the gateway writes a flex batch
        ({"metadata": {"tier": "flex"}}, "flex"),  # a kubectl Batch asking as the seed does
    ],
)
def test_a_batch_reads_the_tier_it_runs_and_is_billed_at(
    spec: dict[str, Any], priority: str
) -> None:
    assert batch_to_openai(_batch(**spec)).priority == priority
