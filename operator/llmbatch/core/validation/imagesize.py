"""An image's format and dimensions from its header alone: PNG, JPEG, GIF and WebP.

What an image costs to decode is its pixel count, not its byte count: a 28 KiB one-bit PNG of
13,376 x 13,376 pixels decodes to 512 MiB. The header says the dimensions; nothing here decodes
a pixel, so reading them costs microseconds whatever the image claims. The engine decodes the
formats it recognises by their content, not by the ``data:`` URL's declared type, so neither
does this; bytes that are none of the four formats read as None (refused: their size cannot be
known before the engine decodes them).
"""

from __future__ import annotations

from dataclasses import dataclass

_PNG = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = frozenset(
    {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
)
"""Start-of-frame markers (every JPEG coding process): they carry the frame's dimensions."""
_JPEG_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})
"""Markers that stand alone (TEM, RSTn): no length follows."""
FORMATS = ("png", "jpeg", "gif", "webp")


@dataclass(frozen=True)
class ImageSize:
    """What an image's header says."""

    format: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def image_size(data: bytes) -> ImageSize | None:
    """The format and dimensions ``data`` declares; None when it is none of :data:`FORMATS`, or
    its header is cut short or names an empty image."""
    if data.startswith(_PNG):
        found = _png(data)
    elif data.startswith(b"\xff\xd8"):
        found = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        found = _gif(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        found = _webp(data)
    else:
        return None
    if found is None or found.width <= 0 or found.height <= 0:
        return None
    return found


def _png(data: bytes) -> ImageSize | None:
    # The IHDR chunk comes first: length (4), "IHDR", width (4), height (4), big-endian. An
    # animated PNG's frames lie within this canvas.
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return ImageSize("png", _be(data, 16, 4), _be(data, 20, 4))


def _jpeg(data: bytes) -> ImageSize | None:
    """The first frame header (SOFn) after SOI, found by skipping segments by their lengths."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_NO_LENGTH:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or scan data before any frame header
            return None
        length = _be(data, at + 2, 2)
        if length < 2:
            return None
        if marker in _JPEG_SOF:
            if at + 9 > len(data):
                return None
            return ImageSize("jpeg", _be(data, at + 7, 2), _be(data, at + 5, 2))
        at += 2 + length
    return None


def _gif(data: bytes) -> ImageSize | None:
    """The logical screen, grown to the first frame's extent (a decoder's canvas)."""
    if len(data) < 13:
        return None
    width, height = _le(data, 6, 2), _le(data, 8, 2)
    packed = data[10]
    at = 13 + (3 << ((packed & 7) + 1) if packed & 0x80 else 0)
    while at < len(data):
        block = data[at]
        if block == 0x2C:  # image descriptor: left, top, width, height
            if at + 9 > len(data):
                return None
            left, top = _le(data, at + 1, 2), _le(data, at + 3, 2)
            right, bottom = left + _le(data, at + 5, 2), top + _le(data, at + 7, 2)
            return ImageSize("gif", max(width, right), max(height, bottom))
        if block != 0x21 or at + 2 > len(data):  # an extension: label, then sub-blocks
            return None
        at += 2
        while at < len(data) and data[at]:
            at += 1 + data[at]
        at += 1
    return None


def _webp(data: bytes) -> ImageSize | None:
    chunk, payload = data[12:16], data[20:]
    if chunk == b"VP8 " and len(payload) >= 10 and payload[3:6] == b"\x9d\x01\x2a":
        return ImageSize("webp", _le(payload, 6, 2) & 0x3FFF, _le(payload, 8, 2) & 0x3FFF)
    if chunk == b"VP8L" and len(payload) >= 5 and payload[0] == 0x2F:
        bits = _le(payload, 1, 4)
        return ImageSize("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(payload) >= 10:
        return ImageSize("webp", _le(payload, 4, 3) + 1, _le(payload, 7, 3) + 1)
    return None


def _be(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "big")


def _le(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little")
