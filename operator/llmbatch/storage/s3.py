"""The object store on S3 or an S3-compatible service (Ceph RGW, versitygw, ...) through boto3.

- Puts stream: up to one part is buffered; data that fits one part is one ``PutObject`` (with
  Content-MD5), larger data a multipart upload that is aborted on any failure.
- ``if_absent`` uses ``If-None-Match: *`` where the server honours it. In ``auto`` mode the store
  probes once (a put, then a conditional put on the same probe key): a server that answers 501 /
  ``NotImplemented`` or ignores the header gets the best-effort fallback, head then put, which
  two racing writers can both pass.
- ``put_if_match`` (compare-and-swap) uses ``If-Match: <ETag>``, probed like ``If-None-Match``
  in ``auto`` mode; without it the store compares the ETag, then puts (best effort).
- ``compose`` is a multipart upload whose parts are server-side ``UploadPartCopy`` ranges for
  sources >= 5 MiB and downloaded-then-uploaded buffers (exactly 5 MiB) for smaller sources and
  the edges of larger ones, so any mix works; copies are pinned to the source ETag seen at head
  time. The result's size is checked against the sum of the sources (``s3compose``).
- The sha256 of an object is recorded as user metadata ``x-amz-meta-sha256`` when known before the
  write (single-request puts, ``put(sha256=...)``, ``compose(sha256=True)``).

This module is the store itself: key mapping, error mapping, conditional writes, single-request
puts, ranged reads and listing. The client and error codes live in ``s3client``, multipart
uploads in ``s3multipart``, ``compose`` in ``s3compose``.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from llmbatch.storage.base import (
    RESERVED_SEGMENT_PREFIX,
    IntegrityError,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    Versioned,
    check_range,
    validate_key,
)
from llmbatch.storage.config import S3Config
from llmbatch.storage.parts import streamed_part_size
from llmbatch.storage.s3client import (
    CONFLICT,
    METADATA_SHA256,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION,
    content_md5,
    error_code,
    make_client,
)
from llmbatch.storage.s3compose import compose_objects
from llmbatch.storage.s3multipart import put_streamed
from llmbatch.storage.streams import iter_chunks

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["S3Store", "make_client"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class S3Store(ObjectStore):
    """An :class:`ObjectStore` on one bucket (under an optional key prefix)."""

    #: Keys per ListObjectsV2 page (S3's maximum; tests lower it to exercise pagination).
    list_page_size = 1000

    def __init__(self, config: S3Config, client: S3Client | None = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.prefix = config.prefix
        self.client: S3Client = client if client is not None else make_client(config)
        self._conditional_lock = threading.Lock()
        self._native_conditional: bool | None = {
            "auto": None,
            "native": True,
            "emulate": False,
        }[config.conditional_writes]
        self._native_if_match = self._native_conditional

    def __repr__(self) -> str:
        return f"S3Store({self.config.to_uri()!r})"

    # -- plumbing (s3multipart and s3compose use it too) -------------------------------------------

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _raise(self, exc: Exception, op: str, key: str) -> NoReturn:
        if isinstance(exc, ClientError):
            code = error_code(exc)
            if code in NOT_FOUND:
                raise ObjectNotFound(key) from exc
            if code == "NoSuchBucket":
                raise StoreError(f"{op} {key}: bucket {self.bucket} does not exist") from exc
            raise StoreError(f"{op} {key}: {code}: {exc}") from exc
        raise StoreError(f"{op} {key}: {exc}") from exc

    def _call(self, op: str, key: str, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, op, key)

    def uses_native_conditional_writes(self) -> bool:
        """Whether ``if_absent`` is enforced by the server (probing it once in ``auto`` mode)."""
        if self._native_conditional is None:
            with self._conditional_lock:
                if self._native_conditional is None:
                    self._native_conditional = self._probe_conditional_writes()
        return self._native_conditional

    def atomic_if_absent(self) -> bool:
        return self.uses_native_conditional_writes()

    def atomic_if_match(self) -> bool:
        """Whether ``put_if_match`` is enforced by the server (probed once in ``auto`` mode)."""
        if self._native_if_match is None:
            with self._conditional_lock:
                if self._native_if_match is None:
                    self._native_if_match = self._probe_if_match()
        return self._native_if_match

    def _probe_if_match(self) -> bool:
        """Put a probe, then put it again under a wrong ``If-Match``: 412 means enforced."""
        return self._probe({"IfMatch": '"0"'}, "If-Match", "lease updates")

    def _probe_conditional_writes(self) -> bool:
        return self._probe({"IfNoneMatch": "*"}, "If-None-Match", "if_absent")

    def _probe(self, condition: dict[str, str], header: str, what: str) -> bool:
        """Put a probe object, then put it again under ``condition`` (which it fails): a 412
        means the server enforces ``header``; 501 / NotImplemented, or a second put that
        succeeds (the header ignored), means it does not, and ``what`` is best effort."""
        probe = f"{self.prefix}{RESERVED_SEGMENT_PREFIX}probe/{uuid.uuid4().hex}"
        try:
            self._call(
                "probe",
                probe,
                lambda: self.client.put_object(
                    Bucket=self.bucket,
                    Key=probe,
                    **self.config.encryption_args(),  # type: ignore[arg-type]
                ),
            )
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=probe,
                    **self.config.encryption_args(),  # type: ignore[arg-type]
                    **condition,  # type: ignore[arg-type]
                )
            except ClientError as exc:
                code = error_code(exc)
                if code in PRECONDITION:
                    return True
                if code in NOT_IMPLEMENTED:
                    log.warning(
                        "s3 %s: no %s (%s); %s is best effort", self.bucket, header, code, what
                    )
                    return False
                self._raise(exc, "probe", probe)
            except BotoCoreError as exc:
                self._raise(exc, "probe", probe)
            log.warning("s3 %s ignores %s; %s is best effort", self.bucket, header, what)
            return False
        finally:
            with contextlib.suppress(ClientError, BotoCoreError):
                self.client.delete_object(Bucket=self.bucket, Key=probe)

    def _conditional(self, if_absent: bool, key: str) -> dict[str, str]:
        """Extra arguments for a create; checks presence itself when the server cannot."""
        if not if_absent:
            return {}
        if self.uses_native_conditional_writes():
            return {"IfNoneMatch": "*"}
        if self.head(key) is not None:
            raise ObjectExists(key)
        return {}

    def _retry_conflicts(self, op: str, key: str, fn: Callable[[], _T]) -> _T:
        """Run a create, mapping 412 to :class:`ObjectExists` and retrying AWS's 409 conflicts."""
        for attempt in range(5):
            try:
                return fn()
            except ClientError as exc:
                code = error_code(exc)
                if code in PRECONDITION:
                    raise ObjectExists(key) from exc
                if code in CONFLICT and attempt < 4:
                    time.sleep(0.05 * 2**attempt)
                    continue
                self._raise(exc, op, key)
            except BotoCoreError as exc:
                self._raise(exc, op, key)
        raise AssertionError("unreachable")

    # -- writes -----------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes | Iterable[bytes],
        *,
        if_absent: bool = False,
        sha256: str | None = None,
    ) -> ObjectInfo:
        full = self._full(key)
        extra = self._conditional(if_absent, key)
        expected = sha256.lower() if sha256 else None
        chunks = iter_chunks(data)
        first_size = streamed_part_size(1, self.config.part_size)
        buffer = bytearray()
        for chunk in chunks:
            buffer += chunk
            if len(buffer) > first_size:
                return put_streamed(self, key, full, buffer, chunks, extra, expected)
        body = bytes(buffer)
        digest = hashlib.sha256(body).hexdigest()
        if expected is not None and digest != expected:
            raise IntegrityError(f"put {key}: data sha256 {digest} != expected {expected}")
        response = self._retry_conflicts(
            "put",
            key,
            lambda: self.client.put_object(
                Bucket=self.bucket,
                Key=full,
                Body=body,
                ContentMD5=content_md5(body),
                Metadata={METADATA_SHA256: digest},
                **self.config.encryption_args(),  # type: ignore[arg-type]
                **extra,  # type: ignore[arg-type]
            ),
        )
        return ObjectInfo(key=key, size=len(body), sha256=digest, etag=response.get("ETag"))

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        full = self._full(key)
        if not self.atomic_if_match():
            current = self.head(key)
            if current is None or current.etag != version:
                raise ObjectChanged(key)
            return self.put(key, data)
        digest = hashlib.sha256(data).hexdigest()
        for attempt in range(5):
            try:
                response = self.client.put_object(
                    Bucket=self.bucket,
                    Key=full,
                    Body=data,
                    ContentMD5=content_md5(data),
                    Metadata={METADATA_SHA256: digest},
                    IfMatch=version,
                    **self.config.encryption_args(),  # type: ignore[arg-type]
                )
                return ObjectInfo(key=key, size=len(data), sha256=digest, etag=response["ETag"])
            except ClientError as exc:
                code = error_code(exc)
                if code in PRECONDITION or code in NOT_FOUND:
                    raise ObjectChanged(key) from exc
                if code in CONFLICT and attempt < 4:
                    time.sleep(0.05 * 2**attempt)
                    continue
                self._raise(exc, "put", key)
            except BotoCoreError as exc:
                self._raise(exc, "put", key)
        raise AssertionError("unreachable")

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if error_code(exc) not in NOT_FOUND:
                self._raise(exc, "delete", key)
        except BotoCoreError as exc:
            self._raise(exc, "delete", key)

    def compose(
        self,
        key: str,
        sources: Sequence[str | ObjectInfo],
        *,
        if_absent: bool = False,
        sha256: bool = False,
    ) -> ObjectInfo:
        return compose_objects(self, key, sources, if_absent=if_absent, sha256=sha256)

    # -- reads ------------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        full = self._full(key)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND:
                return None
            self._raise(exc, "head", key)
        except BotoCoreError as exc:
            self._raise(exc, "head", key)
        return ObjectInfo(
            key=key,
            size=response["ContentLength"],
            sha256=response.get("Metadata", {}).get(METADATA_SHA256),
            etag=response.get("ETag"),
        )

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return b"".join(self.iter_range(key, start, end))

    def get_versioned(self, key: str) -> Versioned:
        full = self._full(key)

        def fetch() -> Versioned:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            return Versioned(response["Body"].read(), response["ETag"])

        return self._call("get", key, fetch)

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        check_range(start, end)
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        full = self._full(key)
        if end == start:
            if self.head(key) is None:
                raise ObjectNotFound(key)
            return iter(())
        opened = self._open_range(key, full, start, end, None)
        if opened is None:
            return iter(())
        return self._stream(key, full, start, end, chunk_size, *opened)

    def _open_range(
        self, key: str, full: str, start: int, end: int | None, etag: str | None
    ) -> tuple[Any, int, str | None] | None:
        """GET ``[start, end)``: (body, length, etag), or None when start is past the end."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if start or end is not None:
            args["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        if etag:
            args["IfMatch"] = etag
        try:
            response = self.client.get_object(**args)
        except ClientError as exc:
            code = error_code(exc)
            if code in ("InvalidRange", "416"):
                return None  # the object exists and is no longer than start
            if code in PRECONDITION:
                raise IntegrityError(f"get {key}: object replaced while reading") from exc
            self._raise(exc, "get", key)
        except BotoCoreError as exc:
            self._raise(exc, "get", key)
        return response["Body"], response["ContentLength"], response.get("ETag")

    def _stream(
        self,
        key: str,
        full: str,
        start: int,
        end: int | None,
        chunk_size: int,
        body: Any,
        length: int,
        etag: str | None,
    ) -> Iterator[bytes]:
        # A dropped connection resumes from the current offset, pinned to the same object version.
        pos, stop = start, start + length
        failures = 0
        try:
            while True:
                try:
                    for chunk in body.iter_chunks(chunk_size):
                        pos += len(chunk)
                        yield chunk
                    break
                except (BotoCoreError, OSError) as exc:
                    failures += 1
                    body.close()
                    if failures >= self.config.max_attempts:
                        raise StoreError(f"get {key}: stream failed at byte {pos}: {exc}") from exc
                    log.info("get %s: resuming at byte %d after %s", key, pos, exc)
                    reopened = self._open_range(key, full, pos, stop, etag)
                    if reopened is None:
                        break
                    body = reopened[0]
        finally:
            body.close()
        if pos != stop:
            raise IntegrityError(f"get {key}: stream ended at byte {pos}, expected {stop}")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix.startswith("/") or "\\" in prefix or "\x00" in prefix:
            raise InvalidKey(prefix, "invalid list prefix")
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.bucket,
            Prefix=self.prefix + prefix,
            PaginationConfig={"PageSize": self.list_page_size},
        )
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(self.prefix) :]
                    if any(seg.startswith(RESERVED_SEGMENT_PREFIX) for seg in key.split("/")):
                        continue
                    yield ObjectInfo(key=key, size=item["Size"], etag=item.get("ETag"))
        except (ClientError, BotoCoreError) as exc:
            self._raise(exc, "list", prefix)
