"""Our wire models and the official openai SDK's models accept each other's output."""

from __future__ import annotations

from typing import Any

import openai.types as oai
import pytest

from llmbatch.api import openai as wire
from llmbatch.core import ids

FULL_BATCH: dict[str, Any] = {
    "id": "batch_abc",
    "object": "batch",
    "endpoint": "/v1/chat/completions",
    "model": "smollm2",
    "errors": {
        "object": "list",
        "data": [{"code": "invalid_json_line", "message": "bad", "param": None, "line": 3}],
    },
    "input_file_id": "file-0123",
    "completion_window": "24h",
    "status": "completed",
    "output_file_id": "file-out",
    "error_file_id": "file-err",
    "created_at": 1_700_000_000,
    "in_progress_at": 1_700_000_001,
    "expires_at": 1_700_086_400,
    "finalizing_at": 1_700_000_100,
    "completed_at": 1_700_000_101,
    "failed_at": None,
    "expired_at": None,
    "cancelling_at": None,
    "cancelled_at": None,
    "request_counts": {"total": 3, "completed": 2, "failed": 1},
    "usage": {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    },
    "metadata": {"team": "support"},
    "priority": "standard",
}


def test_batch_round_trips_through_the_sdk() -> None:
    ours = wire.Batch.model_validate(FULL_BATCH)
    theirs = oai.Batch.model_validate(ours.model_dump(mode="json"))
    assert theirs.request_counts is not None
    assert theirs.request_counts.completed == 2
    assert theirs.usage is not None
    assert theirs.usage.total_tokens == 15
    back = wire.Batch.model_validate(theirs.model_dump(mode="json"))
    assert back.model_dump(exclude={"priority"}) == ours.model_dump(exclude={"priority"})


def test_minimal_sdk_batch_validates_with_ours() -> None:
    theirs = oai.Batch(
        id="batch_1",
        object="batch",
        endpoint="/v1/embeddings",
        input_file_id="file-1",
        completion_window="24h",
        status="validating",
        created_at=1,
    )
    ours = wire.Batch.model_validate(theirs.model_dump(mode="json"))
    assert ours.request_counts == wire.BatchRequestCounts(total=0, completed=0, failed=0)
    assert ours.priority == "standard"


def test_file_objects_round_trip() -> None:
    ours = wire.FileObject(
        id="file-1", bytes=12, created_at=1, filename="x.jsonl", purpose="batch", expires_at=9
    )
    theirs = oai.FileObject.model_validate(ours.model_dump(mode="json"))
    assert theirs.purpose == "batch"
    assert wire.FileObject.model_validate(theirs.model_dump(mode="json")) == ours
    deleted = oai.FileDeleted.model_validate(wire.FileDeleted(id="file-1").model_dump())
    assert deleted.deleted is True


def test_list_envelope_parses_as_sdk_page() -> None:
    page = wire.ListPage[wire.Batch](
        data=[wire.Batch.model_validate(FULL_BATCH)], first_id="batch_abc", last_id="batch_abc"
    )
    dumped = page.model_dump(mode="json")
    assert dumped["object"] == "list"
    assert oai.Batch.model_validate(dumped["data"][0]).id == "batch_abc"
    assert dumped["has_more"] is False


def test_error_envelope_shape() -> None:
    env = wire.ErrorEnvelope(
        error=wire.ErrorBody(message="no", type="invalid_request_error", param="x", code=None)
    )
    assert env.model_dump() == {
        "error": {"message": "no", "type": "invalid_request_error", "param": "x", "code": None}
    }


@pytest.mark.parametrize(
    "line",
    [
        {
            "id": ids.batch_request_id("uid", "c1"),
            "custom_id": "c1",
            "response": {
                "status_code": 200,
                "request_id": ids.request_id("uid", "c1"),
                "body": {"object": "chat.completion", "choices": []},
            },
            "error": None,
        },
        {
            "id": ids.batch_request_id("uid", "c2"),
            "custom_id": "c2",
            "response": None,
            "error": {"code": "batch_expired", "message": "This request could not be executed."},
        },
    ],
)
def test_output_lines_keep_exact_shape(line: dict[str, Any]) -> None:
    parsed = wire.BatchOutputLine.model_validate(line)
    assert parsed.model_dump(mode="json") == line


def test_request_line_accepts_sdk_shaped_rows() -> None:
    row = {
        "custom_id": "r",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    assert wire.BatchRequestLine.model_validate(row).model_dump() == row


def test_ids_are_deterministic_distinct_and_well_formed() -> None:
    a = ids.batch_request_id("uid-1", "x")
    assert a == ids.batch_request_id("uid-1", "x")
    assert a != ids.batch_request_id("uid-2", "x")
    assert ids.batch_request_id("ab", "c") != ids.batch_request_id("a", "bc")
    assert a.startswith("batch_req_")
    assert len(a) == len("batch_req_") + 32
    assert ids.request_id("uid-1", "x").startswith("req_")
    assert ids.batch_id_from_name(ids.batch_object_name("batch_0af")) == "batch_0af"
    with pytest.raises(ValueError, match="not a batch id"):
        ids.batch_object_name("file-1")
