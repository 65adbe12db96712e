"""The object-store interface every backend implements.

Synchronous on purpose: boto3 is synchronous, and async callers (operator, gateway) wrap calls in
``asyncio.to_thread``. Keys are ``/``-separated strings chosen by the caller, never by a client.

Ranges follow Python slicing on the object's bytes, clamped to its size: ``get(key, 5, 100)`` on a
10-byte object returns bytes ``5..9``, ``start >= size`` returns ``b""``. A negative ``start`` or an
``end`` below ``start`` is a :class:`ValueError` (a caller bug), never a silent empty read.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

#: Longest key S3 accepts (in UTF-8 bytes); the filesystem store uses the same limit.
MAX_KEY_BYTES = 1024
#: Key segments starting with this are reserved for a store's own temporary and probe objects.
RESERVED_SEGMENT_PREFIX = ".llmbatch-"

_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


class StoreError(Exception):
    """A store operation failed (transport, permissions, server error)."""


class ObjectNotFound(StoreError):
    """The key does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object not found: {key}")
        self.key = key


class ObjectExists(StoreError):
    """A conditional create found the key already present."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object already exists: {key}")
        self.key = key


class ObjectChanged(StoreError):
    """A compare-and-swap (:meth:`ObjectStore.put_if_match`) found the object rewritten or gone
    since the version it was given: another writer won; read again and decide again."""

    def __init__(self, key: str) -> None:
        super().__init__(f"object changed since it was read: {key}")
        self.key = key


class IntegrityError(StoreError):
    """Stored bytes do not match the expected size or checksum."""


class InvalidKey(StoreError, ValueError):
    """The key is not a valid relative ``/``-separated object key (see :func:`validate_key`)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"invalid object key {key!r}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Versioned:
    """A whole object and the version tag of exactly those bytes (``get_versioned``)."""

    data: bytes
    version: str


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows about one object.

    Passed as a :meth:`ObjectStore.compose` source, ``size`` (and ``sha256`` when set) are the
    *expected* values, checked before anything is written.
    """

    key: str
    size: int
    sha256: str | None = None
    etag: str | None = None


def validate_key(key: str) -> str:
    """Return ``key`` when it is a valid object key, else raise :class:`InvalidKey`.

    Valid: non-empty, at most :data:`MAX_KEY_BYTES` UTF-8 bytes, relative (no leading ``/``), no
    empty, ``.`` or ``..`` segments, no backslash or control characters, no segment starting with
    :data:`RESERVED_SEGMENT_PREFIX`. Both backends enforce the same rules so a key that works on the
    filesystem works on S3 and back.
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey(str(key), "empty")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise InvalidKey(key, f"longer than {MAX_KEY_BYTES} bytes")
    if key.startswith("/"):
        raise InvalidKey(key, "absolute")
    if _CONTROL_CHARS.search(key):
        raise InvalidKey(key, "contains a backslash or control character")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(key, "empty, '.' or '..' segment")
        if segment.startswith(RESERVED_SEGMENT_PREFIX):
            raise InvalidKey(key, f"segment starts with reserved {RESERVED_SEGMENT_PREFIX!r}")
    return key


def check_range(start: int, end: int | None) -> None:
    """Reject ranges that are caller bugs (see the module docstring for range semantics)."""
    if start < 0:
        raise ValueError(f"range start must be >= 0, got {start}")
    if end is not None and end < start:
        raise ValueError(f"range end {end} is before start {start}")


def source_key(source: str | ObjectInfo) -> str:
    """The key of a :meth:`ObjectStore.compose` source."""
    return source.key if isinstance(source, ObjectInfo) else source


def check_expected(source: str | ObjectInfo, actual: ObjectInfo) -> None:
    """Raise :class:`IntegrityError` when ``actual`` contradicts what ``source`` expects.

    A sha256 is only compared when both sides know one; the caller hashes the bytes otherwise.
    """
    if not isinstance(source, ObjectInfo):
        return
    if source.size != actual.size:
        raise IntegrityError(
            f"compose source {source.key}: expected {source.size} bytes, store has {actual.size}"
        )
    if source.sha256 and actual.sha256 and source.sha256 != actual.sha256:
        raise IntegrityError(
            f"compose source {source.key}: expected sha256 {source.sha256}, "
            f"store recorded {actual.sha256}"
        )


class ObjectStore(abc.ABC):
    """One interface over S3 and the local filesystem."""

    @abc.abstractmethod
    def put(
        self,
        key: str,
        data: bytes | Iterable[bytes],
        *,
        if_absent: bool = False,
        sha256: str | None = None,
    ) -> ObjectInfo:
        """Store ``data`` (bytes or a stream of chunks) at ``key``; atomic: readers see all or none.

        With ``if_absent`` the write fails with :class:`ObjectExists` when the key is present.
        With ``sha256`` (hex) the streamed bytes must hash to it, else :class:`IntegrityError` and
        nothing is written. The returned info always carries the sha256 of what was written.
        """

    @abc.abstractmethod
    def get_versioned(self, key: str) -> Versioned:
        """The whole object with its version tag (:class:`ObjectNotFound` when absent): what
        :meth:`put_if_match` compares against. For small objects (leases), read in one call."""

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        """Replace the object only while it is still at ``version`` (compare-and-swap): of two
        writers that read the same version, one wins and the other gets :class:`ObjectChanged`,
        as does a writer whose key was deleted meanwhile."""

    def atomic_if_match(self) -> bool:
        """Whether :meth:`put_if_match` is atomic; False only on S3 without ``If-Match``, where
        it compares, then puts (best effort)."""
        return True

    def atomic_if_absent(self) -> bool:
        """Whether ``put(..., if_absent=True)`` is atomic: of two racing creates exactly one wins.

        True unless a backend says otherwise (S3 without conditional writes checks, then puts:
        both racers can pass the check and the later put replaces the earlier object).
        """
        return True

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end)."""

    @abc.abstractmethod
    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        """Stream bytes ``[start, end)`` of the object in chunks, never holding it all.

        Raises :class:`ObjectNotFound` at call time (not on the first ``next()``) when the key is
        missing; a stream that then fails or comes up short raises :class:`StoreError` /
        :class:`IntegrityError` from ``next()``.
        """

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size (and checksum when known) of the object, or ``None`` when missing."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order.

        ``prefix`` is a plain string prefix, not a directory: ``"a/b"`` matches ``a/b``, ``a/bc``
        and ``a/b/c``. Items may lack ``sha256`` even when :meth:`head` knows it.
        """

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; removing a missing key is not an error."""

    @abc.abstractmethod
    def compose(
        self,
        key: str,
        sources: Sequence[str | ObjectInfo],
        *,
        if_absent: bool = False,
        sha256: bool = False,
    ) -> ObjectInfo:
        """Write the concatenation of ``sources`` (in order) to ``key`` and verify its size.

        A missing source raises :class:`ObjectNotFound` and writes nothing. A source given as an
        :class:`ObjectInfo` must have that size (and sha256, when set), else
        :class:`IntegrityError`. With ``sha256`` the result's hash is computed (S3 reads every
        source once for it) and recorded on the object. ``if_absent`` is as for :meth:`put`.
        An empty ``sources`` writes an empty object.
        """


def delete_under(store: ObjectStore, prefix: str) -> int:
    """Delete every object whose key starts with ``prefix``; the bytes freed."""
    freed = 0
    for info in list(store.list(prefix)):
        store.delete(info.key)
        freed += info.size
    return freed
