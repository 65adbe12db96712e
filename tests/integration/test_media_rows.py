"""Image and audio rows on the real control plane, through the official ``openai`` SDK.

A pool model declares the input modalities it takes (``inputModalities``, text by default). A
row with an image for a text-only model is refused at upload with the line's number, an inline
batch at creation, a kubectl Batch when it is validated; nothing is stored, queued or charged.
A vision model's image rows run (on the simulated engine here; tests/e2e serves them through
real vLLM), estimated by the image rule rather than their base64 as text. ``/v1/models`` lists
each model's modalities. Remote media URLs are refused unless the platform allows them.

Every shape vLLM would read media from that is not an allowed part — a key spelled with a JSON
escape, a part with no ``type``, a ``video_url`` — is refused the same three ways, and a
decompression bomb is refused at upload by its header.
"""

from __future__ import annotations

import base64
import json
import pathlib
import uuid
from typing import Any

import httpx
import openai
import pytest

from llmbatch.core.billing import ESTIMATE_IMAGE_TOKENS
from llmbatch.core.ids import batch_object_name
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.operator import ClusterCLI, OperatorProcess, catalog_pool
from tests.fixtures.pictures import (
    HOSTILE_PARTS,
    data_url,
    escape_image_url_key,
    picture,
    png_bomb,
)
from tests.integration.test_operator import (
    _POOLS,
    _delete_pools,  # noqa: F401  (autouse: each test's pools are deleted)
    apply,
    wait_status,
)

pytestmark = pytest.mark.timeout(600)
CHAT = "/v1/chat/completions"
PHOTO = data_url(picture("PNG", 64, 48) + bytes(90_000))
"""A 90 kB image: 40,000 estimated tokens as text, one image by the image rule."""
HOSTILE_CODES = {
    "escaped-key": ("unsupported_modality", ".image_url.url"),
    "typeless": ("unsupported_content_part", ""),
    "video": ("unsupported_content_part", ""),
}
"""What each hostile shape in ``messages[0].content[1]`` of a text-only model's row is refused
with: its code, and the param's end after the part's place."""
AUDIO = base64.b64encode(b"RIFF" + bytes(32_000)).decode()


@pytest.fixture
def models(cluster: ClusterCLI, tmp_path: pathlib.Path) -> tuple[str, str]:
    """A simulated pool serving a text-only model and a vision model (text and image)."""
    name, suffix = f"pool-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    text, vision = f"text-{suffix}", f"vision-{suffix}"
    _POOLS.append(name)
    pool = catalog_pool(name, text, output_tokens=3)
    pool["spec"]["models"] = [
        {"name": text, "source": "simulated"},
        {"name": vision, "source": "simulated", "inputModalities": ["text", "image"]},
    ]
    apply(cluster, tmp_path, pool)
    return text, vision


def _row(i: int, model: str, *parts: dict[str, Any]) -> dict[str, Any]:
    content = [{"type": "text", "text": f"What is in picture {i}?"}, *parts]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 3}
    return {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": body}


def _image(url: str = PHOTO) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def _kubectl_batch(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    namespace: str,
    tmp_path: pathlib.Path,
    rows: list[dict[str, Any]],
    until: set[str],
) -> dict[str, Any]:
    """A Batch of inline ``rows`` applied with kubectl: its status once in one of ``until``."""
    name = f"batch-{uuid.uuid4().hex[:24]}"
    requests = [
        {"customID": r["custom_id"], "method": "POST", "url": r["url"], "body": r["body"]}
        for r in rows
    ]
    spec = {"endpoint": CHAT, "completionWindow": "24h", "requests": requests}
    manifest = {"apiVersion": "llmbatch.io/v1alpha1", "kind": "Batch", "spec": spec}
    apply(cluster, tmp_path, {**manifest, "metadata": {"name": name, "namespace": namespace}})
    status: dict[str, Any] = wait_status(cluster, operator_process, namespace, name, until)
    return status["status"]  # type: ignore[no-any-return]


def _refusal(err: pytest.ExceptionInfo[openai.BadRequestError]) -> tuple[Any, Any, str]:
    body = err.value.body
    assert isinstance(body, dict)
    return body["code"], body["param"], body["message"]


def test_models_list_their_input_modalities(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str]
) -> None:
    _, client = tenant
    text, vision = models
    listed = {m.id: m.model_extra or {} for m in client.models.list().data}
    assert listed[text]["batch"]["input_modalities"] == ["text"]
    assert listed[vision]["batch"]["input_modalities"] == ["text", "image"]


def test_an_image_row_for_a_text_only_model_is_refused_at_upload_naming_the_line(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str]
) -> None:
    _, client = tenant
    text, vision = models
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(
            file=("bad.jsonl", _jsonl([_row(0, text), _row(1, text, _image())])),
            purpose="batch",
        )
    code, param, message = _refusal(err)
    assert (code, param) == ("unsupported_modality", "body.messages[0].content[1].image_url.url")
    assert message.startswith("Line 2: ")
    assert "accepts text input only" in message
    # remote media: this platform has remoteMedia off
    remote = _row(0, vision, _image("https://example.com/cat.png"))
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("remote.jsonl", _jsonl([remote])), purpose="batch")
    assert _refusal(err)[0] == "remote_media_not_allowed"
    # audio for the vision model (text and image only)
    clip = {"type": "input_audio", "input_audio": {"data": AUDIO, "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("audio.jsonl", _jsonl([_row(0, vision, clip)])), purpose="batch")
    code, param, message = _refusal(err)
    assert (code, param) == ("unsupported_modality", "body.messages[0].content[1].input_audio.data")
    assert "is an audio clip" in message
    assert "accepts text and image input only" in message
    assert client.files.list().data == []  # nothing stored


def test_an_inline_image_row_for_a_text_only_model_is_refused_at_creation(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str], gateway: GatewayProcess
) -> None:
    namespace, client = tenant
    text, _ = models
    rows = [_row(0, text), _row(1, text, _image())]
    with pytest.raises(openai.BadRequestError) as err:
        client.post(
            "/batches",
            body={"requests": rows, "endpoint": CHAT, "completion_window": "24h"},
            cast_to=openai.types.Batch,
        )
    code, param, message = _refusal(err)
    assert (code, param) == (
        "unsupported_modality",
        "requests[1].body.messages[0].content[1].image_url.url",
    )
    assert "Invalid requests[1]" in message
    listed = gateway.kubectl("get", "batches", "-n", namespace, "-o", "name")
    assert listed.strip() == ""  # nothing queued


def test_a_vision_models_image_rows_run_estimated_by_the_image_rule(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenant: tuple[str, openai.OpenAI],
    models: tuple[str, str],
) -> None:
    namespace, client = tenant
    _, vision = models
    rows = [_row(0, vision, _image()), _row(1, vision, _image(), _image()), _row(2, vision)]
    data = _jsonl(rows)
    uploaded = client.files.create(file=("images.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    name = batch_object_name(batch.id)
    done = wait_status(cluster, operator_process, namespace, name, {"completed"})["status"]
    assert done["requestCounts"] == {"total": 3, "completed": 3, "failed": 0}
    estimated = int(done["billing"]["estimatedTokens"])
    text_bytes = len(data) - 3 * len(PHOTO)
    assert estimated <= 3 * ESTIMATE_IMAGE_TOKENS + text_bytes // 3 + 1 + 3 * 3
    assert estimated < len(data) // 3 // 10  # far below its base64 read as text


def test_a_kubectl_batch_with_an_image_row_for_a_text_only_model_fails_validation(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenant: tuple[str, openai.OpenAI],
    models: tuple[str, str],
    tmp_path: pathlib.Path,
) -> None:
    namespace, _ = tenant
    text, _ = models
    rows = [_row(0, text), _row(1, text, _image())]
    failed = _kubectl_batch(cluster, operator_process, namespace, tmp_path, rows, {"failed"})
    assert [(e["code"], e.get("line"), e.get("param")) for e in failed["errors"]] == [
        ("unsupported_modality", 2, "body.messages[0].content[1].image_url.url")
    ]


def _hostile_line(i: int, model: str, shape: str) -> bytes:
    line = json.dumps(_row(i, model, HOSTILE_PARTS[shape]))
    return (escape_image_url_key(line) if shape == "escaped-key" else line).encode() + b"\n"


@pytest.mark.parametrize("shape", sorted(HOSTILE_PARTS))
def test_a_hostile_media_shape_is_refused_at_upload(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str], shape: str
) -> None:
    _, client = tenant
    text, _ = models
    data = _jsonl([_row(0, text)]) + _hostile_line(1, text, shape)
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("hostile.jsonl", data), purpose="batch")
    code, param, message = _refusal(err)
    expected_code, tail = HOSTILE_CODES[shape]
    assert (code, param) == (expected_code, "body.messages[0].content[1]" + tail)
    assert message.startswith("Line 2: ")
    assert client.files.list().data == []  # nothing stored


def test_hostile_media_shapes_are_refused_at_inline_creation(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str], gateway: GatewayProcess
) -> None:
    namespace, client = tenant
    text, _ = models
    for shape in sorted(HOSTILE_PARTS):
        # the request body as sent on the wire: the escaped key reaches the gateway escaped
        raw = b'{"endpoint": "/v1/chat/completions", "completion_window": "24h", "requests": ['
        raw += _hostile_line(0, text, shape).rstrip(b"\n") + b"]}"
        answer = httpx.post(
            f"{client.base_url}batches",
            content=raw,
            headers={
                "Authorization": f"Bearer {client.api_key}",
                "Content-Type": "application/json",
            },
            timeout=30,
        )
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        expected_code, tail = HOSTILE_CODES[shape]
        assert (error["code"], error["param"]) == (
            expected_code,
            "requests[0].body.messages[0].content[1]" + tail,
        ), shape
    listed = gateway.kubectl("get", "batches", "-n", namespace, "-o", "name")
    assert listed.strip() == ""  # nothing queued


def test_a_kubectl_batch_with_hostile_media_shapes_fails_validation(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tenant: tuple[str, openai.OpenAI],
    models: tuple[str, str],
    tmp_path: pathlib.Path,
) -> None:
    namespace, _ = tenant
    text, _ = models
    rows = [json.loads(_hostile_line(i, text, s)) for i, s in enumerate(sorted(HOSTILE_PARTS))]
    failed = _kubectl_batch(
        cluster, operator_process, namespace, tmp_path, [_row(9, text), *rows], {"failed"}
    )
    part = "body.messages[0].content[1]"
    assert [(e["code"], e.get("line"), e.get("param")) for e in failed["errors"]] == [
        (HOSTILE_CODES[shape][0], line, part + HOSTILE_CODES[shape][1])
        for line, shape in enumerate(sorted(HOSTILE_PARTS), start=2)
    ]


def test_a_decompression_bomb_is_refused_at_upload(
    tenant: tuple[str, openai.OpenAI], models: tuple[str, str]
) -> None:
    _, client = tenant
    _, vision = models
    bomb = _row(1, vision, _image(data_url(png_bomb())))
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(
            file=("bomb.jsonl", _jsonl([_row(0, vision, _image()), bomb])), purpose="batch"
        )
    code, param, message = _refusal(err)
    assert (code, param) == ("image_too_large", "body.messages[0].content[1].image_url.url")
    assert "13376 x 13376 PNG image" in message
    assert message.startswith("Line 2: ")
    assert client.files.list().data == []
