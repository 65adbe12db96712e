"""Byte-stream helpers shared by the backends: normalising put data, verified source streams."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

from llmbatch.storage.base import IntegrityError, ObjectInfo, ObjectStore


def iter_chunks(data: bytes | bytearray | memoryview | Iterable[bytes]) -> Iterator[bytes]:
    """The chunks of ``data``: one for bytes-like data, else the iterable's non-empty items."""
    if isinstance(data, bytes | bytearray | memoryview):
        if len(data):
            yield bytes(data)
        return
    for chunk in data:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise TypeError(f"put data chunks must be bytes, got {type(chunk).__name__}")
        if len(chunk):
            yield bytes(chunk)


def verified_source_stream(
    store: ObjectStore,
    sources: Sequence[str | ObjectInfo],
    actual: Sequence[ObjectInfo],
    chunk_size: int = 1 << 20,
) -> Iterator[bytes]:
    """Stream the concatenation of ``sources`` whose heads were ``actual``, checking as it goes.

    Each source must yield exactly its head size (a short or long read means it changed under us)
    and, when the caller expected a sha256, hash to it. Raises :class:`IntegrityError` otherwise.
    """
    for source, info in zip(sources, actual, strict=True):
        expected_sha = source.sha256 if isinstance(source, ObjectInfo) else None
        hasher = hashlib.sha256() if expected_sha else None
        seen = 0
        for chunk in store.iter_range(info.key, 0, None, chunk_size):
            seen += len(chunk)
            if hasher is not None:
                hasher.update(chunk)
            yield chunk
        if seen != info.size:
            raise IntegrityError(
                f"compose source {info.key}: read {seen} bytes, head said {info.size}"
            )
        if hasher is not None and hasher.hexdigest() != expected_sha:
            raise IntegrityError(
                f"compose source {info.key}: sha256 {hasher.hexdigest()} != expected {expected_sha}"
            )
