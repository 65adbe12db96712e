"""Multipart planning for S3: streamed part sizes and the server-side compose plan. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmbatch.storage.config import MAX_PART_SIZE, MIN_PART_SIZE


@dataclass(frozen=True)
class Segment:
    """Bytes ``[start, end)`` of the source object ``key``."""

    key: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class CopyPart:
    """A part the server copies from a source range (``UploadPartCopy``): no bytes pass us."""

    segment: Segment

    @property
    def size(self) -> int:
        return self.segment.size


@dataclass(frozen=True)
class BufferedPart:
    """A part we download (small sources, edges of large ones) and upload (``UploadPart``)."""

    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)


Part = CopyPart | BufferedPart


def streamed_part_size(part_number: int, first_part_size: int) -> int:
    """Size of part ``part_number`` (1-based) of a streamed upload of unknown length.

    Doubles every 1000 parts (capped at S3's 5 GiB) so a stream never runs out of the 10,000
    parts S3 allows while small uploads keep small buffers: with 8 MiB it reaches ~7.8 TiB.
    """
    return min(MAX_PART_SIZE, first_part_size << ((part_number - 1) // 1000))


def plan_compose(
    sources: Sequence[tuple[str, int]],
    *,
    min_part: int = MIN_PART_SIZE,
    max_copy: int = MAX_PART_SIZE,
) -> list[Part]:
    """Split the concatenation of ``sources`` (key, size) into multipart-upload parts.

    Ranges of at least ``min_part`` bytes are copied server-side; smaller sources (and pieces of
    large ones next to them) are gathered into buffered parts of exactly ``min_part`` bytes. So
    every part but the last is >= ``min_part`` and at most ``max(max_copy, min_part)``, the order
    of bytes is kept, and at most ``min_part`` bytes are ever buffered per part.
    """
    parts: list[Part] = []
    pending: list[Segment] = []
    pending_size = 0
    for key, size in sources:
        pos = 0
        while pos < size:
            remaining = size - pos
            if pending_size == 0 and remaining >= min_part:
                take = min(remaining, max_copy)
                parts.append(CopyPart(Segment(key, pos, pos + take)))
            else:
                take = min(remaining, min_part - pending_size)
                pending.append(Segment(key, pos, pos + take))
                pending_size += take
                if pending_size >= min_part:
                    parts.append(BufferedPart(tuple(pending)))
                    pending, pending_size = [], 0
            pos += take
    if pending:
        parts.append(BufferedPart(tuple(pending)))
    return parts
