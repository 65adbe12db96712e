"""The content parts a request may hold: an allow-list of shapes, decided on the parsed line.

vLLM reads media from more shapes than the OpenAI ones: a part with no ``type`` whose keys name
the media (``{"image_url": {"url": ...}}``), any part carrying a ``uuid`` (then its keys decide,
whatever its type), ``video_url``, embeddings of images, audio and video, and chat messages in an
embeddings request. A check that looks for the media it knows lets through every shape it does
not; so this module says what *may* be there, and anything else is refused with the line's
number and the part's place:

* where a part may sit: an element of a ``content`` list (a chat message's, a Responses input
  item's, a chat message given to an embeddings request);
* which parts: text, and per endpoint the media parts of :data:`SHAPES`, each with exactly its
  own fields (a field it does not take, ``uuid`` among them, refuses it);
* nowhere else in the conversation may a dict hold a media field (:data:`MEDIA_FIELDS`), so a
  tool output or a computer-call screenshot cannot carry an image past the rule either.

The line is parsed first, so every spelling of a key (``"image\\u005furl"``) is the same key
here. What the media parts carry (modality, URL, size) is :mod:`llmbatch.core.validation.media`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from llmbatch.core.validation.errors import ErrorCode, InvalidLine
from llmbatch.core.validation.responses import RESPONSES

Modality = Literal["image", "audio"]
Path = tuple[str | int, ...]

MEDIA_FIELDS: frozenset[str] = frozenset(
    {
        "image_url",
        "input_image",
        "image_embeds",
        "image_pil",
        "audio_url",
        "input_audio",
        "audio_embeds",
        "video_url",
        "video_embeds",
        "prompt_embeds",
        "file",
        "input_file",
        "file_id",
        "file_data",
        "file_url",
        "uuid",
    }
)
"""Fields through which vLLM (or an OpenAI endpoint) reads media or files from a dict: outside
an allowed part, a dict of the conversation holding one is refused."""

REFUSED_PARAMETERS: dict[str, str] = {
    "media_io_kwargs": "it sets how the engine loads media",
    "mm_processor_kwargs": "it sets how the engine processes images and audio",
}
"""Body fields (vLLM extensions) a row may not set, and why: they would undo the engine's media
limits for one request."""


@dataclass(frozen=True)
class PartShape:
    """One allowed kind of content part."""

    fields: frozenset[str]
    """Every field the part may have (``type`` included)."""
    modality: Modality | None = None
    """None: a text part."""
    field: str = ""
    """The field holding the media."""
    inner: frozenset[str] | None = None
    """The fields of the media field's object; None: the media field is a string."""
    source: Literal["url", "data"] = "url"
    """Whether the media is a URL (``inner`` has ``url``) or base64 data (``inner``: ``data``)."""


def _text(*fields: str) -> PartShape:
    return PartShape(frozenset({"type", *fields}))


_IMAGE_URL = PartShape(
    frozenset({"type", "image_url"}), "image", "image_url", frozenset({"url", "detail"})
)
_AUDIO_URL = PartShape(frozenset({"type", "audio_url"}), "audio", "audio_url", frozenset({"url"}))
_INPUT_AUDIO = PartShape(
    frozenset({"type", "input_audio"}),
    "audio",
    "input_audio",
    frozenset({"data", "format"}),
    "data",
)
_INPUT_IMAGE = PartShape(
    frozenset({"type", "image_url", "detail", "file_id"}), "image", "image_url"
)

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"

SHAPES: dict[str, dict[str, PartShape]] = {
    CHAT: {
        "text": _text("text"),
        "refusal": _text("refusal"),
        "image_url": _IMAGE_URL,
        "input_audio": _INPUT_AUDIO,
        "audio_url": _AUDIO_URL,
    },
    RESPONSES: {
        "input_text": _text("text"),
        "output_text": _text("text", "annotations", "logprobs"),
        "refusal": _text("refusal"),
        "reasoning_text": _text("text"),
        "summary_text": _text("text"),
        "input_image": _INPUT_IMAGE,
        "input_audio": _INPUT_AUDIO,
    },
    EMBEDDINGS: {"text": _text("text")},
}
"""The parts each endpoint takes. Embeddings take text only."""

CONVERSATION: dict[str, tuple[str, ...]] = {
    CHAT: ("messages",),
    RESPONSES: ("input",),
    EMBEDDINGS: ("messages", "input"),
}
"""The body fields holding each endpoint's conversation (where content parts may sit)."""

_NEVER: dict[str, str] = {
    "video_url": "video input is not supported",
    "video_embeds": "video input is not supported",
    "image_embeds": "embeddings as input are not supported",
    "audio_embeds": "embeddings as input are not supported",
    "prompt_embeds": "embeddings as input are not supported",
    "file": "files are not supported in a batch; send text, or images as data: URLs",
    "input_file": "files are not supported in a batch; send text, or images as data: URLs",
}
"""Why a known but refused part type is refused (a clearer message than "unknown")."""


@dataclass(frozen=True)
class MediaPart:
    """One allowed media part of a request."""

    modality: Modality
    param: str
    """Where the URL or data sits, as the error names it (``body.messages[0].content[1]...``)."""
    holder: dict[str, Any]
    """The parsed object holding the URL or data (the executor replaces it there)."""
    key: str
    """Its field in ``holder``."""
    source: Literal["url", "data", "file"]
    """url: ``holder[key]`` is a URL; data: base64 audio; file: a file reference."""

    @property
    def value(self) -> Any:
        return self.holder.get(self.key)


def param_of(path: Path) -> str:
    """``("body", "messages", 0, "content")`` as ``body.messages[0].content``."""
    text = ""
    for step in path:
        text += f"[{step}]" if isinstance(step, int) else (f".{step}" if text else step)
    return text


def content_parts(
    body: dict[str, Any], endpoint: str, line: int | None = None
) -> tuple[list[MediaPart], InvalidLine | None]:
    """The media parts of ``body``, or the first part or field of a shape not allowed."""
    shapes = SHAPES.get(endpoint)
    if shapes is None:
        return [], None
    walk = _Walk(shapes, endpoint, line)
    for field in CONVERSATION[endpoint]:
        value = body.get(field)
        if type(value) is list:
            if _plain(value):
                continue
        elif type(value) is not dict:
            continue
        problem = walk.tree(value, ("body", field))
        if problem is not None:
            return walk.found, problem
    return walk.found, None


def _plain(items: list[Any]) -> bool:
    """Whether every item is a string, or a dict without a media field whose values are all
    scalars (a message whose content is a string): nothing in it can be a part. The usual row
    is decided here, without the walk."""
    for item in items:
        kind = type(item)
        if kind is dict:
            if not MEDIA_FIELDS.isdisjoint(item):
                return False
            for value in item.values():
                if type(value) is dict or type(value) is list:
                    return False
        elif kind is list:
            return False
    return True


def refused_parameter(body: dict[str, Any], line: int | None) -> InvalidLine | None:
    """The first body field of :data:`REFUSED_PARAMETERS` the row sets (not null)."""
    for name, why in REFUSED_PARAMETERS.items():
        if body.get(name) is not None:
            msg = f"{_where(line)}body.{name} is not supported in a batch: {why}."
            return InvalidLine(ErrorCode.UNSUPPORTED_PARAMETER, msg, line, f"body.{name}")
    return None


class _Walk:
    """One body's conversation walked against its endpoint's ``shapes``; the media parts it
    finds are collected in ``found``."""

    def __init__(self, shapes: dict[str, PartShape], endpoint: str, line: int | None) -> None:
        self.shapes = shapes
        self.endpoint = endpoint
        self.line = line
        self.found: list[MediaPart] = []

    def tree(self, root: Any, path: Path) -> InvalidLine | None:
        """Every dict and list under ``root``: content lists' elements are parts; any other
        dict must hold no media field. Iterative: never a RecursionError."""
        stack: list[tuple[Any, Path]] = [(root, path)]
        while stack:
            value, where = stack.pop()
            if type(value) is list:
                for i, child in enumerate(value):
                    if type(child) is dict or type(child) is list:
                        stack.append((child, (*where, i)))
                continue
            if not MEDIA_FIELDS.isdisjoint(value):
                key = next(k for k in value if k in MEDIA_FIELDS)
                return self.refused(where, f"holds {key!r} outside a content part")
            for key, child in value.items():
                kind = type(child)
                if kind is list and key == "content":
                    problem = self.parts(child, (*where, key))
                    if problem is not None:
                        return problem
                elif kind is dict or kind is list:
                    stack.append((child, (*where, key)))
        return None

    def parts(self, content: list[Any], path: Path) -> InvalidLine | None:
        """Each element of a content list: a string, or a part of an allowed shape."""
        for j, part in enumerate(content):
            if type(part) is str:
                continue  # a plain string is a text part
            if type(part) is not dict:
                return self.refused((*path, j), "is neither a string nor a content part object")
            kind = part.get("type")
            shape = self.shapes.get(kind) if type(kind) is str else None
            if shape is None:
                return self.refused((*path, j), _unknown(kind, self.shapes, self.endpoint))
            if not shape.fields.issuperset(part):
                extra = next(key for key in part if key not in shape.fields)
                what = f"has the field {extra!r}, which a {kind} part does not take"
                return self.refused((*path, j), what)
            if shape.modality is not None:
                problem = self.media(part, str(kind), shape, param_of((*path, j)))
                if problem is not None:
                    return problem
        return None

    def media(
        self, part: dict[str, Any], kind: str, shape: PartShape, param: str
    ) -> InvalidLine | None:
        """Record the media part ``part`` (its fields are allowed), or why its media field is
        bad."""
        assert shape.modality is not None
        line, found = self.line, self.found
        by_file = part.get("file_id") is not None and part.get("image_url") is None
        if kind == "input_image" and by_file:
            found.append(MediaPart("image", f"{param}.file_id", part, "file_id", "file"))
            return None
        if shape.inner is None:
            found.append(
                MediaPart(shape.modality, f"{param}.{shape.field}", part, shape.field, "url")
            )
            return None
        inner = part.get(shape.field)
        if type(inner) is not dict:
            msg = f"{_where(line)}{param}.{shape.field} must be an object."
            return InvalidLine(ErrorCode.INVALID_MEDIA, msg, line, param)
        if not shape.inner.issuperset(inner):
            extra = next(key for key in inner if key not in shape.inner)
            msg = (
                f"{_where(line)}{param}.{shape.field} has the field {extra!r}, not one of its own."
            )
            return InvalidLine(ErrorCode.UNSUPPORTED_CONTENT_PART, msg, line, param)
        key = "url" if shape.source == "url" else "data"
        found.append(
            MediaPart(shape.modality, f"{param}.{shape.field}.{key}", inner, key, shape.source)
        )
        return None

    def refused(self, where: Path, what: str) -> InvalidLine:
        param = param_of(where)
        return InvalidLine(
            ErrorCode.UNSUPPORTED_CONTENT_PART,
            f"{_where(self.line)}{param} {what}.",
            self.line,
            param,
        )


def _unknown(kind: Any, shapes: dict[str, PartShape], endpoint: str) -> str:
    if kind is None:
        return "has no type: every content part names its type"
    if type(kind) is str and kind in _NEVER:
        return f"is a {kind} part: {_NEVER[kind]}"
    if endpoint == EMBEDDINGS:
        return f"is a {str(kind)[:32]!r} part: embeddings take text input only"
    return f"has the type {str(kind)[:32]!r}, which is not one of {', '.join(shapes)}"


def _where(line: int | None) -> str:
    return f"Line {line}: " if line else ""
