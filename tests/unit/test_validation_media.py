"""Image and audio parts of a row: checked against the model's input modalities and the
platform's egress, tallied for the estimate (``llmbatch.core.validation.media``). The allow-list
of part shapes and image headers have their own tests (test_validation_parts.py)."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest

from llmbatch.api.resources import BatchPoolSpec
from llmbatch.core.admission import media_rules
from llmbatch.core.billing import (
    ESTIMATE_IMAGE_TOKENS,
    BatchSize,
    estimate_input_tokens,
)
from llmbatch.core.validation import (
    MediaRules,
    MediaTally,
    ValidationLimits,
    media_problems,
    validate_stream,
)
from tests.fixtures.pictures import picture

CHAT = "/v1/chat/completions"
PNG = base64.b64encode(picture("PNG", 40, 30) + bytes(3000)).decode()
WAV = base64.b64encode(b"RIFF" + bytes(32_000)).decode()
TEXT_ONLY = MediaRules(modalities=frozenset({"text"}), remote=False)
VISION = MediaRules(modalities=frozenset({"text", "image"}), remote=False)


def _image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _chat(i: int, *parts: dict[str, Any], model: str = "m") -> dict[str, Any]:
    content = [{"type": "text", "text": f"Describe {i}."}, *parts]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 5}
    return {"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body}


def _validate(rows: list[dict[str, Any]], rules: MediaRules, endpoint: str = CHAT) -> Any:
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    return validate_stream([data], endpoint=endpoint, limits=ValidationLimits(media=rules))


def test_an_image_row_for_a_text_only_model_is_refused_naming_the_line_and_part() -> None:
    rows = [_chat(0), _chat(1, _image(f"data:image/png;base64,{PNG}"))]
    verdict = _validate(rows, TEXT_ONLY)
    assert [(e.code, e.line, e.param) for e in verdict.errors] == [
        ("unsupported_modality", 2, "body.messages[0].content[1].image_url.url")
    ]
    assert "is an image, but model 'm' accepts text input only" in verdict.errors[0].message


def test_a_vision_model_takes_data_url_images_and_they_are_tallied_not_read_as_text() -> None:
    photo = base64.b64encode(picture("PNG", 64, 64) + bytes(300_000)).decode()  # 300 kB
    url = f"data:image/png;base64,{photo}"
    verdict = _validate([_chat(0, _image(url)), _chat(1, _image(url), _image(url))], VISION)
    assert verdict.ok, verdict.errors
    assert (verdict.media.images, verdict.media.audio_clips) == (3, 0)
    assert verdict.media.encoded_bytes == 3 * len(url)
    size = BatchSize(verdict.total_bytes, 2, 10, 0, verdict.media)
    as_text = estimate_input_tokens(verdict.total_bytes)
    counted = estimate_input_tokens(size.input_bytes, size.media)
    assert counted < as_text / 50
    text_tokens = counted - 3 * ESTIMATE_IMAGE_TOKENS
    assert 0 < text_tokens < (verdict.total_bytes - 3 * len(url)) // 3 + 2


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("data:image/png;base64,", "invalid_media"),
        ("data:image/png;base64,@@not-base64@@", "invalid_media"),
        (f"data:text/plain;base64,{PNG}", "invalid_media"),
        (f"data:image/png,{PNG}", "invalid_media"),
        ("file:///etc/passwd", "invalid_media"),
        ("https://example.com/cat.png", "remote_media_not_allowed"),
        ("", "invalid_media"),
    ],
)
def test_a_bad_or_remote_image_url_is_refused_with_its_code(url: str, code: str) -> None:
    verdict = _validate([_chat(0, _image(url))], VISION)
    assert [(e.code, e.line) for e in verdict.errors] == [(code, 1)]


def test_remote_urls_pass_where_the_platform_allows_egress() -> None:
    rules = replace(VISION, remote=True)
    verdict = _validate([_chat(0, _image("https://example.com/cat.png"))], rules)
    assert verdict.ok
    assert (verdict.media.images, verdict.media.encoded_bytes) == (1, 0)


def test_inline_audio_is_checked_as_base64_and_counted_by_its_decoded_size() -> None:
    rules = MediaRules(modalities=frozenset({"text", "audio"}), remote=False)
    audio = {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}
    bad = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    verdict = _validate([_chat(0, audio), _chat(1, bad)], rules)
    assert [(e.code, e.line, e.param) for e in verdict.errors] == [
        ("invalid_media", 2, "body.messages[0].content[1].input_audio.data")
    ]
    assert (verdict.media.audio_clips, verdict.media.audio_bytes) == (1, 32_004)
    refused = _validate([_chat(0, audio)], VISION)
    assert [e.code for e in refused.errors] == ["unsupported_modality"]
    assert "is an audio clip, but model 'm' accepts text and image input only" in (
        refused.errors[0].message
    )


def test_responses_rows_carry_images_as_input_image_parts() -> None:
    def row(part: dict[str, Any]) -> dict[str, Any]:
        item = {"role": "user", "content": [{"type": "input_text", "text": "Hi"}, part]}
        body = {"model": "m", "input": [item], "max_output_tokens": 5}
        return {"custom_id": "r", "method": "POST", "url": "/v1/responses", "body": body}

    good = row({"type": "input_image", "image_url": f"data:image/jpeg;base64,{PNG}"})
    by_file = row({"type": "input_image", "file_id": "file-abc"})
    assert _validate([good], VISION, "/v1/responses").media.images == 1
    refused = _validate([by_file], VISION, "/v1/responses")
    assert [(e.code, e.param) for e in refused.errors] == [
        ("invalid_media", "body.input[0].content[1].file_id")
    ]
    text_only = _validate([good], TEXT_ONLY, "/v1/responses")
    assert [e.param for e in text_only.errors] == ["body.input[0].content[1].image_url"]


def test_text_rows_pass_any_rules() -> None:
    verdict = _validate([_chat(0), _chat(1)], TEXT_ONLY)
    assert verdict.ok
    assert verdict.media.empty


def test_no_rules_known_yet_checks_only_the_form_of_the_parts() -> None:
    tally = MediaTally()
    body = _chat(0, _image("https://example.com/x.png"), _image("data:image/png;base64,"))["body"]
    problems = media_problems(body, CHAT, MediaRules(), tally, 3)
    assert [(p.code, p.line) for p in problems] == [("invalid_media", 3)]
    assert tally.images == 1


def test_the_pool_model_declares_its_modalities_text_by_default() -> None:
    spec = BatchPoolSpec.model_validate(
        {
            "models": [
                {"name": "plain", "source": "/m"},
                {"name": "vlm", "source": "/v", "inputModalities": ["text", "image"]},
            ]
        }
    )
    caps = {"max_image_pixels": 4096 * 4096, "max_images": 16}
    assert media_rules(spec, "plain", False) == MediaRules(frozenset({"text"}), False, **caps)
    assert media_rules(spec, "vlm", True) == MediaRules(frozenset({"text", "image"}), True, **caps)
    assert media_rules(spec, "other", False).modalities is None
    with pytest.raises(ValueError, match=r"inputModalities|input_modalities"):
        BatchPoolSpec.model_validate(
            {"models": [{"name": "x", "source": "/m", "inputModalities": ["video"]}]}
        )
