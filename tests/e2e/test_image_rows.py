"""Image rows through the whole stack and the real vLLM CPU engine: the official ``openai``
SDK uploads rows with PNG ``data:`` URLs for a vision-language model (``tinyvlm``: a tiny
Idefics3 with random weights, generated once into the model cache), the operator runs them on a
slot, and every answer is a ChatCompletion whose ``usage.prompt_tokens`` counts the image
tokens the model's processor made of each picture. The answers themselves are meaningless.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from PIL import Image

from llmbatch.executor.tinyvlm import IMAGE_PROMPT_TOKENS
from tests.e2e.stack import prepared_pool, serving
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.operator import ClusterCLI, OperatorProcess
from tests.integration.test_operator import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def vision_stack(
    cluster: ClusterCLI,
    operator_process: OperatorProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[GatewayProcess, str, str]]:
    """A one-slot vLLM pool serving tinyvlm (text and image input) behind a gateway."""
    pool = prepared_pool("tinyvlm")
    folder = pool["spec"]["models"][0]["source"]
    pool["spec"]["models"] = [
        {"name": "tinyvlm", "source": folder, "inputModalities": ["text", "image"]}
    ]
    pool["spec"]["executor"]["engineArgs"] = ['--limit-mm-per-prompt={"image": 2}']
    with serving(cluster, operator_process, tmp_path_factory.mktemp("e2e-vlm"), pool) as up:
        yield up


def _png(width: int, height: int, colour: tuple[int, int, int]) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _row(custom_id: str, *images: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in images]
    content: Any = [*parts, {"type": "text", "text": QUESTION}] if images else QUESTION
    body = {
        "model": "tinyvlm",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "temperature": 0,
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_image_rows_run_through_vllm_with_their_image_tokens_counted(
    vision_stack: tuple[GatewayProcess, str, str], operator_process: OperatorProcess
) -> None:
    gateway, key, _ = vision_stack
    client = openai.OpenAI(base_url=gateway.base_url + "/v1", api_key=key, max_retries=0)
    listed = {m.id: m.model_extra or {} for m in client.models.list().data}
    assert listed["tinyvlm"]["batch"]["input_modalities"] == ["text", "image"]
    rows = [
        _row("text-only"),
        _row("one-image", _png(640, 480, (200, 30, 30))),
        _row("two-images", _png(17, 300, (30, 200, 30)), _png(64, 64, (30, 30, 200))),
    ]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    uploaded = client.files.create(file=("images.jsonl", data), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for(
        lambda: (
            (b := client.batches.retrieve(batch.id)).status
            in {"completed", "failed", "expired", "cancelled"}
            and b
        ),
        600,
        "the image batch to end",
        operator_process.logs,
    )
    assert done.status == "completed", (done, operator_process.logs())
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    assert done.output_file_id
    assert done.error_file_id is None
    lines = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    prompts: dict[str, int] = {}
    for line in lines:
        assert line["error"] is None, line
        assert line["response"]["status_code"] == 200, line
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.model == "tinyvlm"
        assert completion.usage is not None
        prompts[line["custom_id"]] = completion.usage.prompt_tokens
    # Whatever the picture's size, the processor resizes it to 64x64: 19 prompt tokens each.
    assert prompts["one-image"] - prompts["text-only"] == IMAGE_PROMPT_TOKENS
    assert prompts["two-images"] - prompts["text-only"] == 2 * IMAGE_PROMPT_TOKENS
    assert done.usage is not None
    assert done.usage.input_tokens == sum(prompts.values())
