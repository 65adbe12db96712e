"""Image and audio parts of a request: what they are, whether the model takes them, what they weigh.

Seed 000: "Rows may include the images and audio the model accepts". A request carries media as
content parts (the OpenAI shapes, plus vLLM's ``audio_url``):

* chat: ``messages[i].content[j]`` of type ``image_url`` (``{"url": ...}``), ``input_audio``
  (``{"data": <base64>, "format": ...}``) or ``audio_url`` (``{"url": ...}``);
* responses: ``input[i].content[j]`` of type ``input_image`` (``image_url``: a URL string) or
  ``input_audio``.

Each part is checked against the pool model's input modalities (refused with the line's number
before anything is queued, not failed after GPU time) and its URL against the platform's egress:
``data:`` URLs always, ``http(s)`` only where remote media is allowed (the chart's
``remoteMedia.enabled``), anything else never. The parts are tallied so the credit estimate counts
media by its own rule (``core.billing``), not base64 as text.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

from llmbatch.core.validation.errors import ErrorCode, InvalidLine

MODALITIES: tuple[str, ...] = ("text", "image", "audio")
"""The input modalities a pool model may declare (``BatchPool.spec.models[].inputModalities``)."""
HINTS: tuple[bytes, ...] = (b'_url"', b'"input_audio"', b'"input_image"')
"""Byte strings every line with a media part contains: a line with none of them is not scanned."""
_REMOTE = ("https://", "http://")
_NOUN = {"image": "an image", "audio": "an audio clip"}


@dataclass
class MediaTally:
    """The media parts of the lines seen so far (what the estimate needs of them)."""

    images: int = 0
    audio_clips: int = 0
    audio_bytes: int = 0
    """Decoded bytes of the inline (base64) audio."""
    encoded_bytes: int = 0
    """Bytes of the lines that are base64 media payload (not text to tokenize)."""

    @property
    def empty(self) -> bool:
        return not (self.images or self.audio_clips)


@dataclass(frozen=True)
class MediaRules:
    """What the pool model and the platform accept."""

    modalities: frozenset[str] | None = None
    """The model's input modalities; None: not checked (no pool known yet)."""
    remote: bool = True
    """Whether http(s) media URLs may be fetched by the engine (the platform allows egress)."""


@dataclass(frozen=True)
class _Part:
    modality: str
    param: str
    url: str | None  # image_url / audio_url / input_image
    data: str | None  # input_audio's base64


def has_media_hint(line: bytes) -> bool:
    """Whether ``line`` may hold a media part (three substring searches at C speed)."""
    return any(hint in line for hint in HINTS)


def media_problems(
    body: dict[str, Any],
    endpoint: str,
    rules: MediaRules,
    tally: MediaTally,
    line: int | None = None,
) -> list[InvalidLine]:
    """Check the media parts of ``body`` against ``rules``; add what they weigh to ``tally``."""
    problems: list[InvalidLine] = []
    model = body.get("model")
    for part in _parts(body, endpoint):
        problem = _modality_problem(part, rules, model, line) or _source_problem(
            part, rules, tally, line
        )
        if problem is not None:
            problems.append(problem)
        elif part.modality == "image":
            tally.images += 1
        else:
            tally.audio_clips += 1
    return problems


def _parts(body: dict[str, Any], endpoint: str) -> list[_Part]:
    if endpoint == "/v1/chat/completions":
        items, field = body.get("messages"), "messages"
    elif endpoint == "/v1/responses":
        items, field = body.get("input"), "input"
    else:
        return []
    if type(items) is not list:
        return []
    found: list[_Part] = []
    for i, item in enumerate(items):
        content = item.get("content") if type(item) is dict else None
        if type(content) is not list:
            continue
        for j, piece in enumerate(content):
            if type(piece) is dict:
                part = _part(piece, f"body.{field}[{i}].content[{j}]")
                if part is not None:
                    found.append(part)
    return found


def _part(piece: dict[str, Any], param: str) -> _Part | None:
    kind = piece.get("type")
    if kind == "image_url" or kind == "audio_url":
        value = piece.get(kind)
        url = value.get("url") if type(value) is dict else value
        modality = "image" if kind == "image_url" else "audio"
        return _Part(modality, f"{param}.{kind}.url", url if type(url) is str else "", None)
    if kind == "input_image":
        if piece.get("file_id") is not None and piece.get("image_url") is None:
            return _Part("image", f"{param}.file_id", None, None)
        url = piece.get("image_url")
        return _Part("image", f"{param}.image_url", url if type(url) is str else "", None)
    if kind == "input_audio":
        value = piece.get("input_audio")
        data = value.get("data") if type(value) is dict else None
        return _Part("audio", f"{param}.input_audio.data", None, data if type(data) is str else "")
    return None


def _modality_problem(
    part: _Part, rules: MediaRules, model: Any, line: int | None
) -> InvalidLine | None:
    if rules.modalities is None or part.modality in rules.modalities:
        return None
    accepted = " and ".join(m for m in MODALITIES if m in rules.modalities) or "no"
    where = f"Line {line}: " if line else ""
    msg = (
        f"{where}{part.param} is {_NOUN[part.modality]}, but model {str(model)[:64]!r} accepts "
        f"{accepted} input only."
    )
    return InvalidLine(ErrorCode.UNSUPPORTED_MODALITY, msg, line, part.param)


def _source_problem(
    part: _Part, rules: MediaRules, tally: MediaTally, line: int | None
) -> InvalidLine | None:
    """The part's URL or payload: a well-formed ``data:`` URL (or base64), or an allowed remote."""
    where = f"Line {line}: " if line else ""
    if part.data is not None:
        decoded = _base64_size(part.data)
        if decoded is None:
            msg = f"{where}{part.param} must be non-empty base64 audio data."
            return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
        tally.audio_bytes += decoded
        tally.encoded_bytes += len(part.data)
        return None
    url = part.url
    if url is None:
        msg = (
            f"{where}{part.param}: file references are not supported in a batch; send the "
            "image as a data: URL."
        )
        return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
    if url.startswith("data:"):
        head, comma, payload = url.partition(",")
        decoded = _base64_size(payload) if comma and head.endswith(";base64") else None
        if decoded is None or not head[5:].startswith(part.modality + "/"):
            msg = (
                f"{where}{part.param} must be a data:{part.modality}/<type>;base64,<data> URL "
                "with non-empty base64 data."
            )
            return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
        if part.modality == "audio":
            tally.audio_bytes += decoded
        tally.encoded_bytes += len(url)
        return None
    if url.startswith(_REMOTE):
        if rules.remote:
            return None
        msg = (
            f"{where}{part.param} is a remote URL, and this platform does not fetch remote "
            "media; send it inline as a data: URL."
        )
        return InvalidLine(ErrorCode.REMOTE_MEDIA_NOT_ALLOWED, msg, line, part.param)
    msg = f"{where}{part.param} must be a data: URL or an https:// URL."
    return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)


def _base64_size(payload: str) -> int | None:
    """Decoded size of strict base64 ``payload``; None when empty or malformed."""
    if not payload:
        return None
    try:
        return len(binascii.a2b_base64(payload, strict_mode=True))
    except (binascii.Error, ValueError):
        return None
