"""Retention as the gateway shows it: expires_at on File objects, output_expires_after, 404s."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from llmbatch.core import keys
from llmbatch.gateway.mapping import file_to_openai
from tests.fixtures.gateway import FakeGateway, auth


def _line(i: int) -> bytes:
    row = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**row, "body": {"model": "m", "max_tokens": 4}}).encode() + b"\n"


def _upload(gw: FakeGateway, key: str) -> Any:
    return gw.client.post(
        "/v1/files",
        headers=auth(key),
        files={"file": ("r.jsonl", _line(1))},
        data={"purpose": "batch"},
    ).json()


def _create(gw: FakeGateway, key: str, file_id: str, **extra: Any) -> Any:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return gw.client.post("/v1/batches", headers=auth(key), json={**body, **extra})


def test_the_operator_plan_in_status_wins_over_the_upload_expiry() -> None:
    spec = {
        "id": "file-" + "a" * 32,
        "bytes": 1,
        "filename": "r.jsonl",
        "purpose": "batch",
        "storageKey": "files/t/x",
        "createdAt": 1000,
        "expiresAt": 1000 + 86400,
    }
    assert file_to_openai({"metadata": {}, "spec": spec}).expires_at == 1000 + 86400
    accepted = {"metadata": {}, "spec": spec, "status": {"expiresAt": 5000 + 172800}}
    assert file_to_openai(accepted).expires_at == 5000 + 172800
    openai.types.FileObject.model_validate(file_to_openai(accepted).model_dump(mode="json"))


def test_upload_shows_expires_at_from_the_start(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key("team-r")
    uploaded = _upload(fake_gateway, key)
    assert uploaded["expires_at"] == uploaded["created_at"] + 86400


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"anchor": "created_at", "seconds": 60}, "output_expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2592001}, "output_expires_after.seconds"),
        ({"anchor": "completed_at", "seconds": 3600}, "output_expires_after.anchor"),
        ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
        ({"anchor": "created_at"}, "output_expires_after.seconds"),
        ("7d", "output_expires_after"),
    ],
)
def test_bad_output_expires_after_is_400(fake_gateway: FakeGateway, value: Any, param: str) -> None:
    key = fake_gateway.key("team-r")
    file_id = _upload(fake_gateway, key)["id"]
    answer = _create(fake_gateway, key, file_id, output_expires_after=value)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_output_expires_after_lands_on_the_batch_spec(fake_gateway: FakeGateway) -> None:
    fake_gateway.serve("m")
    key = fake_gateway.key("team-r")
    file_id = _upload(fake_gateway, key)["id"]
    value = {"anchor": "created_at", "seconds": 3 * 86400}
    answer = _create(fake_gateway, key, file_id, output_expires_after=value)
    assert answer.status_code == 200, answer.text
    name = answer.json()["id"].replace("_", "-", 1)
    spec = fake_gateway.kube.objects["batches", "team-r", name]["spec"]
    assert spec["outputExpiresAfterSeconds"] == 3 * 86400


def test_a_file_retention_deleted_answers_404_the_openai_way(fake_gateway: FakeGateway) -> None:
    key = fake_gateway.key("team-r")
    file_id = _upload(fake_gateway, key)["id"]
    # What the sweep does: the bytes, then the object.
    (fake_gateway.store_root / keys.file_key("team-r", file_id)).unlink()
    content = fake_gateway.client.get(f"/v1/files/{file_id}/content", headers=auth(key))
    assert content.status_code == 404
    assert content.json()["error"]["param"] == "file_id"
    del fake_gateway.kube.objects["batchfiles", "team-r", file_id]
    fake_gateway.client.app.state.gateway.reads.put("batchfiles", "team-r", file_id, None)
    for path in (f"/v1/files/{file_id}", f"/v1/files/{file_id}/content"):
        answer = fake_gateway.client.get(path, headers=auth(key))
        assert answer.status_code == 404
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert file_id in error["message"]
