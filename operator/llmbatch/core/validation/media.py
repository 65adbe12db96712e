"""Image and audio parts of a request: whether the model takes them, where they come from, what
they weigh.

Seed 000: "Rows may include the images and audio the model accepts". Which parts a row may hold
at all is :mod:`llmbatch.core.validation.parts`'s allow-list (the OpenAI shapes, plus vLLM's
``audio_url``); each media part it finds is then checked here:

* against the pool model's input modalities (refused with the line's number before anything is
  queued, not failed after GPU time);
* its source: a ``data:`` URL always, ``http(s)`` only where remote media is allowed (the
  chart's ``remoteMedia.enabled``: the executor fetches it through its address guard), anything
  else never;
* an inline image's header (:mod:`llmbatch.core.validation.imagesize`): PNG, JPEG, GIF or WebP,
  at most the pool's pixels per image; and at most the pool's images per request.

The parts are tallied so the credit estimate counts media by its own rule (``core.billing``),
not base64 as text.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

from llmbatch.core.validation.errors import ErrorCode, InvalidLine
from llmbatch.core.validation.imagesize import image_size
from llmbatch.core.validation.parts import (
    MediaPart,
    content_parts,
    refused_parameter,
)

MODALITIES: tuple[str, ...] = ("text", "image", "audio")
"""The input modalities a pool model may declare (``BatchPool.spec.models[].inputModalities``)."""
REMOTE = ("https://", "http://")
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
    """Whether http(s) media URLs may be fetched (the executor fetches them, guarded)."""
    max_image_pixels: int | None = None
    """Pixels (width x height) an image may have; None: not checked (no pool known yet)."""
    max_images: int | None = None
    """Images one request may hold; None: not checked (no pool known yet)."""


def media_problems(
    body: dict[str, Any],
    endpoint: str,
    rules: MediaRules,
    tally: MediaTally,
    line: int | None = None,
) -> list[InvalidLine]:
    """Check the content parts of ``body`` against the allow-list and ``rules``; add what its
    media weigh to ``tally``."""
    refused = refused_parameter(body, line)
    if refused is not None:
        return [refused]
    parts, shape = content_parts(body, endpoint, line)
    if shape is not None:
        return [shape]
    problems: list[InvalidLine] = []
    images = 0
    for part in parts:
        problem = _modality_problem(part, rules, body.get("model"), line) or _source_problem(
            part, rules, tally, line
        )
        if problem is not None:
            problems.append(problem)
        elif part.modality == "image":
            images += 1
            if rules.max_images is not None and images == rules.max_images + 1:
                problems.append(_too_many_images(part, rules.max_images, line))
        else:
            tally.audio_clips += 1
    tally.images += images
    return problems


def _too_many_images(part: MediaPart, most: int, line: int | None) -> InvalidLine:
    where = f"Line {line}: " if line else ""
    msg = f"{where}the request holds more than {most} images; send at most {most} per request."
    return InvalidLine(ErrorCode.TOO_MANY_IMAGES, msg, line, part.param)


def _modality_problem(
    part: MediaPart, rules: MediaRules, model: Any, line: int | None
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
    part: MediaPart, rules: MediaRules, tally: MediaTally, line: int | None
) -> InvalidLine | None:
    """The part's URL or payload: a well-formed ``data:`` URL (or base64), or an allowed remote."""
    where = f"Line {line}: " if line else ""
    value = part.value
    if part.source == "file":
        msg = (
            f"{where}{part.param}: file references are not supported in a batch; send the "
            "image as a data: URL."
        )
        return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
    if part.source == "data":
        decoded = _base64(value) if type(value) is str else None
        if decoded is None:
            msg = f"{where}{part.param} must be non-empty base64 audio data."
            return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
        tally.audio_bytes += len(decoded)
        tally.encoded_bytes += len(value)
        return None
    url = value if type(value) is str else ""
    if url.startswith("data:"):
        return _data_url_problem(part, url, rules, tally, line)
    if url.startswith(REMOTE):
        if rules.remote:
            return None
        msg = (
            f"{where}{part.param} is a remote URL, and this platform does not fetch remote "
            "media; send it inline as a data: URL."
        )
        return InvalidLine(ErrorCode.REMOTE_MEDIA_NOT_ALLOWED, msg, line, part.param)
    msg = f"{where}{part.param} must be a data: URL or an https:// URL."
    return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)


def _data_url_problem(
    part: MediaPart, url: str, rules: MediaRules, tally: MediaTally, line: int | None
) -> InvalidLine | None:
    where = f"Line {line}: " if line else ""
    head, comma, payload = url.partition(",")
    decoded = _base64(payload) if comma and head.endswith(";base64") else None
    if decoded is None or not head[5:].startswith(part.modality + "/"):
        msg = (
            f"{where}{part.param} must be a data:{part.modality}/<type>;base64,<data> URL "
            "with non-empty base64 data."
        )
        return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, part.param)
    if part.modality == "image":
        problem = image_problem(decoded, rules.max_image_pixels)
        if problem is not None:
            code, what = problem
            return InvalidLine(code, f"{where}{part.param} {what}", line, part.param)
    else:
        tally.audio_bytes += len(decoded)
    tally.encoded_bytes += len(url)
    return None


def image_problem(data: bytes, max_pixels: int | None) -> tuple[ErrorCode, str] | None:
    """Why the image ``data`` is refused (its code, and what is wrong, to follow its place in a
    message), or None: a PNG, JPEG, GIF or WebP header of at most ``max_pixels`` pixels."""
    size = image_size(data)
    if size is None:
        return ErrorCode.INVALID_MEDIA, "is not a PNG, JPEG, GIF or WebP image."
    if max_pixels is not None and size.pixels > max_pixels:
        return ErrorCode.IMAGE_TOO_LARGE, (
            f"is a {size.width} x {size.height} {size.format.upper()} image "
            f"({size.pixels} pixels); the most an image may have is {max_pixels} pixels."
        )
    return None


def _base64(payload: str) -> bytes | None:
    """Strict base64 ``payload`` decoded; None when empty or malformed."""
    if not payload:
        return None
    try:
        return binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError):
        return None
