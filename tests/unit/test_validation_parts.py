"""The allow-list of content-part shapes (``core.validation.parts``), decided on the parsed line,
and the image header check (``core.validation.imagesize``): every shape vLLM would read media
from that is not an allowed part is refused with the line and the place, whatever the spelling
of its keys; an image is refused by the pixels its header declares, without decoding it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmbatch.core.validation import MediaRules, ValidationLimits, content_parts, validate_stream
from llmbatch.core.validation.imagesize import image_size
from tests.fixtures.pictures import (
    BOMB_SIDE,
    HOSTILE_PARTS,
    METADATA_URL,
    data_url,
    escape_image_url_key,
    picture,
    png_bomb,
)

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
EMBEDDINGS = "/v1/embeddings"
TEXT_ONLY = MediaRules(modalities=frozenset({"text"}), remote=False)
VISION = MediaRules(
    modalities=frozenset({"text", "image"}),
    remote=True,
    max_image_pixels=4096 * 4096,
    max_images=3,
)


def _row(body: dict[str, Any], url: str = CHAT, custom_id: str = "r") -> dict[str, Any]:
    body = {"model": "m", **body}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _chat(*parts: Any, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is it?"}, *parts]
    return _row({"messages": [{"role": "user", "content": content}], "max_tokens": 5, **extra})


def _verdict(lines: list[str], rules: MediaRules, url: str = CHAT) -> list[tuple[Any, ...]]:
    data = "".join(line + "\n" for line in lines).encode()
    result = validate_stream([data], endpoint=url, limits=ValidationLimits(media=rules))
    return [(e.code, e.line, e.param) for e in result.errors]


@pytest.mark.parametrize("shape", sorted(HOSTILE_PARTS))
def test_the_three_hostile_shapes_are_refused_for_a_text_only_model(shape: str) -> None:
    line = json.dumps(_chat(HOSTILE_PARTS[shape]))
    if shape == "escaped-key":
        line = escape_image_url_key(line)
        assert "image\\u005furl" in line
        assert 'image_url"' not in line  # no byte marker of a media part is left
    plain = _row({"messages": [{"role": "user", "content": "Hi"}]}, custom_id="plain")
    found = _verdict([json.dumps(plain), line], TEXT_ONLY)
    param = "body.messages[0].content[1]"
    expected = {
        "escaped-key": ("unsupported_modality", 2, param + ".image_url.url"),
        "typeless": ("unsupported_content_part", 2, param),
        "video": ("unsupported_content_part", 2, param),
    }
    assert found == [expected[shape]]


@pytest.mark.parametrize("rules", [TEXT_ONLY, VISION, MediaRules()])
def test_typeless_and_video_parts_are_refused_whatever_the_model_takes(rules: MediaRules) -> None:
    for part in (HOSTILE_PARTS["typeless"], HOSTILE_PARTS["video"]):
        assert _verdict([json.dumps(_chat(part))], rules) == [
            ("unsupported_content_part", 1, "body.messages[0].content[1]")
        ]


@pytest.mark.parametrize(
    ("part", "why"),
    [
        # a uuid sends vLLM down its typeless branch: its keys decide, not its type
        ({"type": "text", "text": "x", "uuid": "u", "image_url": METADATA_URL}, "'uuid'"),
        ({"type": "image_url", "image_url": {"url": METADATA_URL}, "uuid": "u"}, "'uuid'"),
        ({"type": "text", "text": "x", "image_url": {"url": METADATA_URL}}, "'image_url'"),
        ({"type": "file", "file": {"file_id": "file-1"}}, "files are not supported"),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, "embeddings as input"),
        ({"type": "input_image", "image_url": METADATA_URL}, "not one of text"),
        ({"type": 7}, "has the type '7'"),
        (["nested"], "neither a string nor a content part"),
    ],
)
def test_unknown_or_extended_part_shapes_are_refused(part: Any, why: str) -> None:
    line = json.dumps(_chat(part))
    data = (line + "\n").encode()
    result = validate_stream([data], endpoint=CHAT, limits=ValidationLimits(media=VISION))
    assert [(e.code, e.param) for e in result.errors] == [
        ("unsupported_content_part", "body.messages[0].content[1]")
    ]
    assert why in result.errors[0].message
    assert result.errors[0].message.startswith("Line 1: ")


def test_media_outside_a_content_part_is_refused_wherever_it_nests() -> None:
    message = {"role": "user", "content": "hi", "image_url": {"url": METADATA_URL}}
    tool_output = {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_image", "image_url": METADATA_URL}],
    }
    responses = _row({"input": [tool_output], "max_output_tokens": 5}, RESPONSES)
    assert _verdict([json.dumps(_row({"messages": [message]}))], VISION) == [
        ("unsupported_content_part", 1, "body.messages[0]")
    ]
    assert _verdict([json.dumps(responses)], VISION, RESPONSES) == [
        ("unsupported_content_part", 1, "body.input[0].output[0]")
    ]


def test_embeddings_take_text_only_in_messages_and_input() -> None:
    image = {"type": "image_url", "image_url": {"url": data_url(picture("PNG", 8, 8))}}
    conversation = [{"role": "user", "content": [image]}]
    as_messages = _row({"messages": conversation}, EMBEDDINGS)
    as_input = _row({"input": conversation}, EMBEDDINGS)
    batched = _row({"input": [conversation]}, EMBEDDINGS)
    for row, param in (
        (as_messages, "body.messages[0].content[0]"),
        (as_input, "body.input[0].content[0]"),
        (batched, "body.input[0][0].content[0]"),
    ):
        assert _verdict([json.dumps(row)], VISION, EMBEDDINGS) == [
            ("unsupported_content_part", 1, param)
        ]
    text = _row({"input": ["a", "b"]}, EMBEDDINGS)
    assert _verdict([json.dumps(text)], VISION, EMBEDDINGS) == []


@pytest.mark.parametrize("name", ["mm_processor_kwargs", "media_io_kwargs"])
def test_a_row_cannot_change_how_the_engine_loads_media(name: str) -> None:
    row = _chat(**{name: {"max_pixels": 1 << 30}})
    assert _verdict([json.dumps(row)], VISION) == [("unsupported_parameter", 1, f"body.{name}")]


def test_allowed_parts_pass_and_their_media_are_found() -> None:
    png = data_url(picture("PNG", 8, 8))
    body = _chat(
        "a plain string part",
        {"type": "image_url", "image_url": {"url": png, "detail": "auto"}},
        {"type": "audio_url", "audio_url": {"url": "https://example.com/a.wav"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    )["body"]
    body["messages"].insert(
        0, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    )
    parts, problem = content_parts(body, CHAT, 1)
    assert problem is None
    assert [(p.modality, p.param, p.source) for p in parts] == [
        ("image", "body.messages[1].content[2].image_url.url", "url"),
        ("audio", "body.messages[1].content[3].audio_url.url", "url"),
        ("audio", "body.messages[1].content[4].input_audio.data", "data"),
    ]
    assert parts[0].value == png


@pytest.mark.parametrize(
    ("fmt", "save"),
    [
        ("PNG", {}),
        ("JPEG", {}),
        ("JPEG", {"progressive": True, "exif": b"Exif\x00\x00" + bytes(5000)}),
        ("GIF", {}),
        ("WEBP", {"lossless": False}),
        ("WEBP", {"lossless": True}),
    ],
)
def test_image_headers_give_the_encoders_dimensions(fmt: str, save: dict[str, Any]) -> None:
    size = image_size(picture(fmt, 321, 123, **save))
    assert size is not None
    assert (size.format, size.width, size.height) == (fmt.lower(), 321, 123)


def test_an_extended_webp_and_a_gif_frame_beyond_its_screen_read_as_a_decoder_sees_them() -> None:
    vp8x = b"RIFF" + bytes(4) + b"WEBPVP8X" + bytes(4) + bytes(4) + (9999).to_bytes(3, "little")
    vp8x += (4999).to_bytes(3, "little")
    assert image_size(vp8x) == image_size(vp8x)  # deterministic
    assert (image_size(vp8x).width, image_size(vp8x).height) == (10000, 5000)  # type: ignore[union-attr]
    # logical screen 10 x 10, first frame at (0, 0) of 6000 x 7000: the canvas grows
    gif = b"GIF89a" + (10).to_bytes(2, "little") * 2 + b"\x00\x00\x00"
    gif += b"\x2c" + bytes(4) + (6000).to_bytes(2, "little") + (7000).to_bytes(2, "little")
    assert image_size(gif) is not None
    assert (image_size(gif).width, image_size(gif).height) == (6000, 7000)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "data",
    [b"", b"BM" + bytes(100), b"\x89PNG\r\n\x1a\n" + bytes(3000), b"\xff\xd8\xff\xd9", b"GIF89a"],
)
def test_unknown_or_cut_short_headers_read_as_nothing(data: bytes) -> None:
    assert image_size(data) is None


def test_a_decompression_bomb_is_refused_by_its_header() -> None:
    bomb = png_bomb()
    assert len(bomb) < 32 * 1024
    size = image_size(bomb)
    assert size is not None
    assert size.pixels == BOMB_SIDE * BOMB_SIDE
    row = _chat({"type": "image_url", "image_url": {"url": data_url(bomb)}})
    data = (json.dumps(row) + "\n").encode()
    result = validate_stream([data], endpoint=CHAT, limits=ValidationLimits(media=VISION))
    assert [(e.code, e.param) for e in result.errors] == [
        ("image_too_large", "body.messages[0].content[1].image_url.url")
    ]
    assert "13376 x 13376 PNG image (178917376 pixels)" in result.errors[0].message


def test_images_per_request_and_unknown_formats_are_refused() -> None:
    png = {"type": "image_url", "image_url": {"url": data_url(picture("PNG", 8, 8))}}
    bmp = {"type": "image_url", "image_url": {"url": data_url(picture("BMP", 8, 8))}}
    assert _verdict([json.dumps(_chat(png, png, png))], VISION) == []
    assert _verdict([json.dumps(_chat(png, png, png, png))], VISION) == [
        ("too_many_images", 1, "body.messages[0].content[4].image_url.url")
    ]
    assert _verdict([json.dumps(_chat(bmp))], VISION) == [
        ("invalid_media", 1, "body.messages[0].content[1].image_url.url")
    ]
