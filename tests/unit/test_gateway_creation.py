"""``POST /v1/batches`` without I/O: llmbatch.gateway.creation and llmbatch.gateway.admission."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from llmbatch.api.resources import BatchSpec, InlineRequest
from llmbatch.core.admission import Refusal
from llmbatch.core.billing import BatchSize
from llmbatch.gateway.admission import PoolPlan, plan_admission, reservation
from llmbatch.gateway.creation import (
    CreateBatchRequest,
    batch_manifest,
    batch_name,
    check_input_file,
    parse_create_request,
)
from llmbatch.gateway.errors import APIError

CHAT = "/v1/chat/completions"


def row(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body},
    }


def parse(**fields: Any) -> Any:
    body = {"endpoint": CHAT, "completion_window": "24h", **fields}
    return parse_create_request(CreateBatchRequest.model_validate(body))


def refused(**fields: Any) -> APIError:
    with pytest.raises(APIError) as err:
        parse(**fields)
    assert err.value.status == 400
    return err.value


def test_inline_requests_become_a_typed_spec_measured_in_one_pass() -> None:
    rows = [row(1, max_tokens=100), row(2), row(3, max_tokens=10, max_completion_tokens=20)]
    request = parse(requests=rows, metadata={"tier": "flex"})
    assert isinstance(request.spec, BatchSpec)
    assert request.spec.priority == "flex"
    assert all(isinstance(item, InlineRequest) for item in request.spec.requests)
    assert request.input_param == "requests"
    size = request.inline.size
    lines = [orjson.dumps({**r, "method": "POST"}) for r in rows]
    assert size.input_bytes == sum(len(line) + 1 for line in lines)
    assert size.requests == 3
    # the validator's limits (the larger of both fields, as for an uploaded file's lines)
    assert size.output_token_limits == 100 + 20
    assert size.requests_without_output_limit == 1
    assert request.inline.model == "m"
    spec = batch_manifest(
        "batch-x", "ns", request, requests=3, estimated_tokens=7, idempotency_label="", now_ns=1
    )["spec"]
    assert spec["requests"][0] == {
        "customID": "r1",
        "method": "POST",
        "url": CHAT,
        "body": rows[0]["body"],
    }


def test_the_inline_fingerprint_is_the_one_replays_were_keyed_by() -> None:
    """Idempotency replays compare this value with the annotation of batches created before."""
    rows = [row(1, max_tokens=5), row(2)]
    wire = [
        {"customID": r["custom_id"], "method": "POST", "url": CHAT, "body": r["body"]} for r in rows
    ]
    digest = hashlib.sha256(orjson.dumps(wire, option=orjson.OPT_SORT_KEYS)).hexdigest()
    assert parse(requests=rows).fingerprint == "inline-" + digest[:32]
    assert parse(input_file_id="file-" + "a" * 32).fingerprint == "file-" + "a" * 32


def test_embeddings_count_no_output_tokens() -> None:
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "e"}}
    request = parse(endpoint="/openai/v1/embeddings", requests=[line])
    assert request.spec.endpoint == "/v1/embeddings"
    assert request.inline.size.output_token_limits == 0
    assert request.inline.size.requests_without_output_limit == 0


@pytest.mark.parametrize(
    ("fields", "param", "code", "words"),
    [
        (
            {"metadata": {f"k{i}": "v" for i in range(17)}},
            "metadata",
            "invalid_value",
            "16, got 17",
        ),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "string_above_max_length", "length 512"),
        (
            {"output_expires_after": {"anchor": "created_at", "seconds": 3599}},
            "output_expires_after.seconds",
            "invalid_value",
            "between 3600 and 2592000, but got 3599",
        ),
        (
            {"output_expires_after": {"anchor": "created_at", "seconds": 2592001}},
            "output_expires_after.seconds",
            "invalid_value",
            "between 3600 and 2592000",
        ),
    ],
)
def test_limits_batchspec_declares_answer_as_openai_errors(
    fields: dict[str, Any], param: str, code: str, words: str
) -> None:
    error = refused(input_file_id="file-" + "a" * 32, **fields)
    assert (error.param, error.code) == (param, code)
    assert words in error.message


def test_too_many_inline_requests_is_batchspecs_limit() -> None:
    error = refused(requests=[row(i) for i in range(1001)])
    assert (error.param, error.code) == ("requests", "too_many_requests")
    assert "At most 1000 inline requests" in error.message
    assert len(parse(requests=[row(i) for i in range(1000)]).spec.requests) == 1000


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"completion_window": "48h"}, "completion_window"),
        ({"completion_window": "999999h"}, "completion_window"),
        ({"endpoint": "/v2/x"}, "endpoint"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"priority": "urgent"}, "priority"),
        ({"priority": "expedited", "metadata": {"tier": "flex"}}, "priority"),
        ({"output_expires_after": {"anchor": "completed_at", "seconds": 3600}}, None),
        ({"requests": []}, "requests"),
        ({"requests": [row(1), row(1)]}, "requests[1].custom_id"),
    ],
)
def test_wire_rules(fields: dict[str, Any], param: str | None) -> None:
    if "requests" not in fields:
        fields = {"input_file_id": "file-" + "a" * 32, **fields}
    error = refused(**fields)
    if param is not None:
        assert error.param == param
    else:
        assert (error.param or "").startswith("output_expires_after")


def test_a_malformed_file_id_is_an_unknown_one() -> None:
    with pytest.raises(APIError) as err:
        parse(input_file_id="../../etc/passwd")
    assert err.value.status == 404
    assert err.value.param == "input_file_id"


def test_idempotency_names() -> None:
    name, label = batch_name("team-a", "k")
    assert batch_name("team-a", "k") == (name, label)
    assert batch_name("team-b", "k")[0] != name
    assert name.startswith("batch-")
    assert len(name) == len("batch-") + 24
    random_name, no_label = batch_name("team-a", None)
    assert no_label == ""
    assert random_name != batch_name("team-a", None)[0]


def test_input_file_checks_and_recorded_size() -> None:
    file_id = "file-" + "b" * 32
    with pytest.raises(APIError) as err:
        check_input_file(file_id, None, CHAT)
    assert err.value.status == 404
    output = {"spec": {"purpose": "batch_output"}}
    with pytest.raises(APIError) as err:
        check_input_file(file_id, output, CHAT)
    assert err.value.code == "invalid_file_purpose"
    embeddings = {
        "metadata": {"annotations": {"llmbatch.io/endpoint": "/v1/embeddings"}},
        "spec": {"purpose": "batch"},
    }
    with pytest.raises(APIError) as err:
        check_input_file(file_id, embeddings, CHAT)
    assert err.value.code == "mismatched_endpoint"
    older = {"spec": {"purpose": "batch", "bytes": 300, "lineCount": 3, "model": "m"}}
    size, model = check_input_file(file_id, older, CHAT)
    assert size == BatchSize(300, 3, 0, 3)  # recorded before limits were: none assumed
    assert model == "m"


def test_admission_plans_on_the_pool_or_refuses() -> None:
    size = BatchSize(3000, requests=3, output_token_limits=300, requests_without_output_limit=0)
    free = plan_admission(None, "standard", size, "input_file_id")
    assert isinstance(free, PoolPlan)
    assert free.pool is None
    assert free.estimate.amount == 0
    pool = {
        "metadata": {"name": "p"},
        "spec": {
            "models": [{"name": "m", "source": "/m"}],
            "limits": {"maxRequests": 2},
            "tiers": {
                "standard": {
                    "drainTargetSeconds": 60,
                    "pricing": {"inputPerMillion": "1", "outputPerMillion": "2"},
                }
            },
        },
    }
    refusal = plan_admission(pool, "standard", size, "requests")
    assert isinstance(refusal, Refusal)
    assert (refusal.code, refusal.param) == ("too_many_requests", "requests")
    pool["spec"]["limits"] = {}
    plan = plan_admission(pool, "standard", size, "requests")
    assert isinstance(plan, PoolPlan)
    assert plan.estimate.amount > 0
    hold = reservation("batch-x", plan, 5)
    assert (hold.batch, hold.pool, hold.mode, hold.created_at) == ("batch-x", "p", "Tokens", 5)


def test_inline_requests_remember_the_first_without_an_output_limit() -> None:
    """Seed 000: the gateway refuses it when the model's pool requires a limit (its route)."""
    from llmbatch.gateway.inlinecheck import unbounded_inline_error

    bounded = parse(requests=[row(0, max_tokens=8), row(1, max_completion_tokens=8)])
    assert bounded.inline.first_unbounded is None
    assert unbounded_inline_error(bounded.inline, CHAT) is None
    request = parse(requests=[row(0, max_tokens=8), row(1), row(2)])
    assert request.inline.first_unbounded == 1
    error = unbounded_inline_error(request.inline, CHAT)
    assert error is not None
    assert (error.status, error.code) == (400, "missing_output_token_limit")
    assert error.param == "requests[1].body.max_completion_tokens"
