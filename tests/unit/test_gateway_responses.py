"""/v1/responses through the gateway: uploads, creation (file and inline) and the catalog."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmbatch.api.openai import ENDPOINTS
from llmbatch.core.tenancy import Tenant
from llmbatch.gateway.creation import CreateBatchRequest, parse_create_request
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.routes.models import model_catalog
from tests.fixtures.gateway import FakeGateway, auth

RESPONSES = "/v1/responses"


def _row(i: int, url: str = RESPONSES, **body: Any) -> dict[str, Any]:
    fields = {"model": "m", "input": f"Question {i}?", "max_output_tokens": 16, **body}
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": url,
        "body": {k: v for k, v in fields.items() if v is not ...},
    }


def _jsonl(*rows: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _upload(gw: FakeGateway, key: str, data: bytes) -> Any:
    return gw.client.post(
        "/v1/files", headers=auth(key), files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}
    )


def _catalog_pool(generate: str = "m", pooling: str = "e") -> dict[str, Any]:
    models = [
        {"name": generate, "source": "/m"},
        {"name": pooling, "source": "/e", "runner": "pooling"},
    ]
    return {"metadata": {"name": "catalog"}, "spec": {"models": models}}


def test_a_responses_batch_is_uploaded_and_created(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key = fake_gateway.key("team-a")
    rows = [_row(1), _row(2, input=[{"role": "user", "content": "hi"}], store=True)]
    upload = _upload(fake_gateway, key, _jsonl(*rows, _row(3, url="/openai/v1/responses")))
    assert upload.status_code == 200, upload.text
    created = fake_gateway.client.post(
        "/v1/batches",
        headers=auth(key),
        json={
            "input_file_id": upload.json()["id"],
            "endpoint": RESPONSES,
            "completion_window": "24h",
        },
    )
    assert created.status_code == 200, created.text
    assert created.json()["endpoint"] == RESPONSES
    (batch,) = [
        obj for (plural, _, _), obj in fake_gateway.kube.objects.items() if plural == "batches"
    ]
    assert batch["spec"]["endpoint"] == RESPONSES


@pytest.mark.parametrize(
    ("bad", "code", "param"),
    [
        (_row(3, previous_response_id="resp_1"), "unsupported_parameter", "previous_response_id"),
        (_row(3, background=True), "unsupported_parameter", "background"),
        (_row(3, conversation="conv_1"), "unsupported_parameter", "conversation"),
        (_row(3, prompt={"id": "pmpt_1"}), "unsupported_parameter", "prompt"),
        (_row(3, input=...), "missing_input", "input"),
        (_row(3, stream=True), "stream_not_supported", "stream"),
        (_row(3, max_output_tokens=...), "missing_output_token_limit", "max_output_tokens"),
        (_row(3, max_output_tokens=-1), "invalid_output_token_limit", "max_output_tokens"),
    ],
)
def test_a_bad_responses_line_is_a_400_naming_its_line(
    fake_gateway: FakeGateway, bad: dict[str, Any], code: str, param: str
) -> None:
    # model m is served by a catalog (Tokens) pool: every row needs max_output_tokens.
    fake_gateway.kube.pools.append(_catalog_pool())
    key = fake_gateway.key("team-a")
    response = _upload(fake_gateway, key, _jsonl(_row(1), _row(2), bad, _row(4)))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, f"body.{param}")
    assert error["message"].startswith("Line 3: ")
    assert error["type"] == "invalid_request_error"
    assert not list(fake_gateway.store_root.rglob("file-*"))


def _create(**fields: Any) -> Any:
    body = {"endpoint": RESPONSES, "completion_window": "24h", **fields}
    return parse_create_request(CreateBatchRequest.model_validate(body))


def test_inline_responses_requests() -> None:
    request = _create(requests=[_row(0), _row(1, max_output_tokens=...)])
    assert request.spec.endpoint == RESPONSES
    assert (request.inline.size.output_token_limits, request.inline.first_unbounded) == (16, 1)
    with pytest.raises(APIError) as err:
        _create(requests=[_row(0), _row(1, background=True)])
    assert (err.value.status, err.value.code) == (400, "unsupported_parameter")
    assert err.value.param == "requests[1].body.background"


def test_an_unknown_endpoint_lists_every_supported_one() -> None:
    with pytest.raises(APIError) as err:
        _create(endpoint="/v1/audio/speech", input_file_id="file-x")
    assert all(endpoint in err.value.message for endpoint in ENDPOINTS)


def test_the_catalog_lists_responses_for_generate_models() -> None:
    entries = {
        entry["id"]: entry["batch"]["endpoints"]
        for entry in model_catalog([_catalog_pool()], Tenant("team-a"))
    }
    assert entries == {
        "m": ["/v1/chat/completions", "/v1/completions", "/v1/responses"],
        "e": ["/v1/embeddings"],
    }
