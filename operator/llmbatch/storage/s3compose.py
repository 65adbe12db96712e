"""``compose`` on S3: one object from the concatenation of others, mostly copied server-side.

A multipart upload whose parts are ``UploadPartCopy`` ranges for sources >= 5 MiB and
downloaded-then-uploaded buffers (exactly 5 MiB) for smaller sources and the edges of larger
ones, so any mix works; every read and copy is pinned to the source ETag seen at head time. The
result's size is checked against the sum of the sources.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from llmbatch.storage.base import (
    IntegrityError,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    check_expected,
    source_key,
)
from llmbatch.storage.config import MAX_PARTS
from llmbatch.storage.parts import BufferedPart, CopyPart, Part, plan_compose
from llmbatch.storage.s3client import METADATA_SHA256
from llmbatch.storage.s3multipart import MultipartUpload
from llmbatch.storage.streams import verified_source_stream

if TYPE_CHECKING:
    from llmbatch.storage.s3 import S3Store


def compose_objects(
    store: S3Store,
    key: str,
    sources: Sequence[str | ObjectInfo],
    *,
    if_absent: bool,
    sha256: bool,
) -> ObjectInfo:
    """Write ``key`` as the concatenation of ``sources`` (see :meth:`ObjectStore.compose`)."""
    full = store._full(key)
    if if_absent and store.head(key) is not None:
        raise ObjectExists(key)  # fast path; the write itself is still conditional
    actual = _head_sources(store, sources)
    total = sum(info.size for info in actual)
    unverified = any(
        isinstance(s, ObjectInfo) and s.sha256 and not a.sha256
        for s, a in zip(sources, actual, strict=True)
    )
    digest: str | None = None
    if sha256 or unverified:
        hasher = hashlib.sha256()
        for chunk in verified_source_stream(store, sources, actual):
            hasher.update(chunk)
        digest = hasher.hexdigest()

    plan = plan_compose([(a.key, a.size) for a in actual])
    etags = {a.key: a.etag for a in actual}
    if len(plan) <= 1 and not any(isinstance(p, CopyPart) for p in plan):
        body = b"".join(download_part(store, p, etags) for p in plan)
        result = store.put(key, body, if_absent=if_absent, sha256=digest)
    elif len(plan) > MAX_PARTS:
        # Thousands of tiny sources: stream them through a growing-part upload instead.
        stream = verified_source_stream(store, sources, actual)
        result = store.put(key, stream, if_absent=if_absent, sha256=digest)
    else:
        result = _compose_multipart(store, key, full, plan, etags, if_absent, digest, total)
    if result.size != total:
        raise IntegrityError(f"compose {key}: wrote {result.size} bytes, sources sum {total}")
    return result


def _head_sources(store: S3Store, sources: Sequence[str | ObjectInfo]) -> list[ObjectInfo]:
    """What the store holds for each source, checked against what the caller expects."""
    actual: list[ObjectInfo] = []
    for source in sources:
        info = store.head(source_key(source))
        if info is None:
            raise ObjectNotFound(source_key(source))
        check_expected(source, info)
        actual.append(info)
    return actual


def download_part(store: S3Store, part: Part, etags: dict[str, str | None]) -> bytes:
    """The bytes of a buffered part, each read pinned to the source ETag seen at head time."""
    assert isinstance(part, BufferedPart)
    pieces: list[bytes] = []
    for seg in part.segments:
        full = store._full(seg.key)
        opened = store._open_range(seg.key, full, seg.start, seg.end, etags.get(seg.key))
        if opened is None:
            raise IntegrityError(f"compose: source {seg.key} shrank below byte {seg.start}")
        stream = store._stream(seg.key, full, seg.start, seg.end, 1 << 20, *opened)
        pieces.append(b"".join(stream))
    return b"".join(pieces)


def _compose_multipart(
    store: S3Store,
    key: str,
    full: str,
    plan: list[Part],
    etags: dict[str, str | None],
    if_absent: bool,
    digest: str | None,
    total: int,
) -> ObjectInfo:
    extra = store._conditional(if_absent, key)
    metadata = {METADATA_SHA256: digest} if digest else {}
    upload = MultipartUpload.start(store, "compose", key, full, metadata)
    try:
        for number, part in enumerate(plan, start=1):
            if isinstance(part, CopyPart):
                upload.copy_part(part, etags)
            else:
                body = download_part(store, part, etags)
                if len(body) != part.size:
                    raise IntegrityError(f"compose {key}: part {number} read short")
                upload.upload_part(body)
        result_etag = upload.complete(extra)
    except BaseException:
        upload.abort()
        raise
    head = store.head(key)
    if head is None or head.size != total:
        got = "nothing" if head is None else f"{head.size} bytes"
        if head is not None and head.etag == result_etag:
            store.delete(key)
        raise IntegrityError(f"compose {key}: store has {got}, sources sum {total}")
    return ObjectInfo(key=key, size=total, sha256=digest, etag=result_etag)
