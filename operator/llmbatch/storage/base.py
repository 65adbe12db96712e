"""The object-store interface every backend implements.

Synchronous on purpose: boto3 is synchronous, and async callers (operator, gateway) wrap calls in
``asyncio.to_thread``. Keys are ``/``-separated strings chosen by the caller, never by a client.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


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


class IntegrityError(StoreError):
    """Stored bytes do not match the expected size or checksum."""


@dataclass(frozen=True)
class ObjectInfo:
    """What the store knows about one object."""

    key: str
    size: int
    sha256: str | None = None
    etag: str | None = None


class ObjectStore(abc.ABC):
    """One interface over S3 and the local filesystem."""

    @abc.abstractmethod
    def put(
        self, key: str, data: bytes | Iterable[bytes], *, if_absent: bool = False
    ) -> ObjectInfo:
        """Store ``data`` (bytes or a stream of chunks) at ``key``; atomic: readers see all or none.

        With ``if_absent`` the write fails with :class:`ObjectExists` when the key is present.
        """

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end)."""

    @abc.abstractmethod
    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        """Stream bytes ``[start, end)`` of the object in chunks, never holding it all."""

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size (and checksum when known) of the object, or ``None`` when missing."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object; removing a missing key is not an error."""

    @abc.abstractmethod
    def compose(self, key: str, sources: list[str]) -> ObjectInfo:
        """Write the concatenation of ``sources`` (in order) to ``key`` and verify its size."""
