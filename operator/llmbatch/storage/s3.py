"""The object store on S3 or an S3-compatible service (MinIO, Ceph RGW, moto...) through boto3.

- Puts stream: up to one part is buffered; data that fits one part is one ``PutObject`` (with
  Content-MD5), larger data a multipart upload that is aborted on any failure.
- ``if_absent`` uses ``If-None-Match: *`` where the server honours it. In ``auto`` mode the store
  probes once (a put, then a conditional put on the same probe key): a server that answers 501 /
  ``NotImplemented`` or ignores the header gets the best-effort fallback, head then put, which
  two racing writers can both pass.
- ``compose`` is a multipart upload whose parts are server-side ``UploadPartCopy`` ranges for
  sources >= 5 MiB and downloaded-then-uploaded buffers (exactly 5 MiB) for smaller sources and
  the edges of larger ones, so any mix works; copies are pinned to the source ETag seen at head
  time. The result's size is checked against the sum of the sources.
- The sha256 of an object is recorded as user metadata ``x-amz-meta-sha256`` when known before the
  write (single-request puts, ``put(sha256=...)``, ``compose(sha256=True)``).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import boto3
import botocore.config
from botocore.exceptions import BotoCoreError, ClientError

from llmbatch.storage.base import (
    RESERVED_SEGMENT_PREFIX,
    IntegrityError,
    InvalidKey,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    check_expected,
    check_range,
    source_key,
    validate_key,
)
from llmbatch.storage.config import MAX_PARTS, S3Config, read_credentials
from llmbatch.storage.parts import BufferedPart, CopyPart, Part, plan_compose, streamed_part_size
from llmbatch.storage.streams import iter_chunks, verified_source_stream

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
_PRECONDITION = frozenset({"PreconditionFailed", "412"})
_NOT_IMPLEMENTED = frozenset({"NotImplemented", "501"})
#: AWS answers 409 when two conditional writes to one key overlap; one of them will win, retry.
_CONFLICT = frozenset({"ConditionalRequestConflict", "409"})
_METADATA_SHA256 = "sha256"


def _code(exc: ClientError) -> str:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if not code:
        code = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code


def _md5(data: bytes | memoryview) -> str:
    return base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")


def make_client(config: S3Config) -> S3Client:
    """A boto3 S3 client; credentials: explicit, else secret dir, else boto3's chain."""
    credentials = config.credentials
    if credentials is None and config.secret_dir:
        try:
            credentials = read_credentials(config.secret_dir)
        except (OSError, ValueError) as exc:
            raise StoreError(f"cannot read store credentials: {exc}") from exc
    boto_config = botocore.config.Config(
        region_name=config.region,
        signature_version="s3v4",
        s3={"addressing_style": "path" if config.path_style else "auto"},
        retries={"max_attempts": config.max_attempts, "mode": config.retry_mode},
        request_checksum_calculation=config.checksum,
        response_checksum_validation=config.checksum,
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        max_pool_connections=32,
    )
    # Building a client from a fresh Session reloads the service model (~0.5 s); share one.
    # Sessions are not thread-safe, clients are: create clients under a lock.
    with _SESSION_LOCK:
        return _shared_session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            aws_access_key_id=credentials.access_key_id if credentials else None,
            aws_secret_access_key=credentials.secret_access_key if credentials else None,
            aws_session_token=credentials.session_token if credentials else None,
            config=boto_config,
        )


_SESSION_LOCK = threading.Lock()


@functools.cache
def _shared_session() -> boto3.session.Session:
    return boto3.session.Session()


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

    def __repr__(self) -> str:
        return f"S3Store({self.config.to_uri()!r})"

    # -- plumbing ---------------------------------------------------------------------------------

    def _full(self, key: str) -> str:
        return self.prefix + validate_key(key)

    def _raise(self, exc: Exception, op: str, key: str) -> NoReturn:
        if isinstance(exc, ClientError):
            code = _code(exc)
            if code in _NOT_FOUND:
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

    def _probe_conditional_writes(self) -> bool:
        probe = f"{self.prefix}{RESERVED_SEGMENT_PREFIX}probe/{uuid.uuid4().hex}"
        try:
            self._call(
                "probe", probe, lambda: self.client.put_object(Bucket=self.bucket, Key=probe)
            )
            try:
                self.client.put_object(Bucket=self.bucket, Key=probe, IfNoneMatch="*")
            except ClientError as exc:
                code = _code(exc)
                if code in _PRECONDITION:
                    return True
                if code in _NOT_IMPLEMENTED:
                    log.warning(
                        "s3 %s: no conditional writes (%s); if_absent is best effort",
                        self.bucket,
                        code,
                    )
                    return False
                self._raise(exc, "probe", probe)
            except BotoCoreError as exc:
                self._raise(exc, "probe", probe)
            log.warning("s3 %s ignores If-None-Match; if_absent is best effort", self.bucket)
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
                code = _code(exc)
                if code in _PRECONDITION:
                    raise ObjectExists(key) from exc
                if code in _CONFLICT and attempt < 4:
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
                return self._put_multipart(key, full, buffer, chunks, extra, expected)
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
                ContentMD5=_md5(body),
                Metadata={_METADATA_SHA256: digest},
                **extra,  # type: ignore[arg-type]
            ),
        )
        return ObjectInfo(key=key, size=len(body), sha256=digest, etag=response.get("ETag"))

    def _put_multipart(
        self,
        key: str,
        full: str,
        buffer: bytearray,
        rest: Iterator[bytes],
        extra: dict[str, str],
        expected: str | None,
    ) -> ObjectInfo:
        if extra and self.head(key) is not None:
            raise ObjectExists(key)  # fail before uploading parts that could never be completed
        metadata = {_METADATA_SHA256: expected} if expected else {}
        upload_id = self._call(
            "put",
            key,
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=full, Metadata=metadata
            )["UploadId"],
        )
        hasher = hashlib.sha256()
        size = 0
        parts: list[CompletedPartTypeDef] = []

        def upload(body: bytes) -> None:
            nonlocal size
            number = len(parts) + 1
            if number > MAX_PARTS:
                raise StoreError(f"put {key}: more than {MAX_PARTS} parts")
            hasher.update(body)
            size += len(body)
            etag = self._upload_part(key, full, upload_id, number, body)
            parts.append({"PartNumber": number, "ETag": etag})

        def drain() -> None:
            # Upload whole parts while more than one part is buffered; the rest waits for data.
            while len(buffer) > (part := streamed_part_size(len(parts) + 1, self.config.part_size)):
                upload(bytes(buffer[:part]))
                del buffer[:part]

        try:
            drain()
            for chunk in rest:
                buffer += chunk
                drain()
            upload(bytes(buffer))
            del buffer[:]
            digest = hasher.hexdigest()
            if expected is not None and digest != expected:
                raise IntegrityError(f"put {key}: data sha256 {digest} != expected {expected}")
            etag = self._complete(key, full, upload_id, parts, extra)
        except BaseException:
            self._abort(full, upload_id)
            raise
        return ObjectInfo(key=key, size=size, sha256=digest, etag=etag)

    def _upload_part(self, key: str, full: str, upload_id: str, number: int, body: bytes) -> str:
        response = self._call(
            "upload part",
            key,
            lambda: self.client.upload_part(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                Body=body,
                ContentMD5=_md5(body),
            ),
        )
        return response["ETag"]

    def _complete(
        self,
        key: str,
        full: str,
        upload_id: str,
        parts: list[CompletedPartTypeDef],
        extra: dict[str, str],
    ) -> str | None:
        def complete(conditional: dict[str, str]) -> str | None:
            response = self._retry_conflicts(
                "complete",
                key,
                lambda: self.client.complete_multipart_upload(
                    Bucket=self.bucket,
                    Key=full,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                    **conditional,  # type: ignore[arg-type]
                ),
            )
            return response.get("ETag")

        try:
            return complete(extra)
        except StoreError as exc:
            # Some servers take If-None-Match on PutObject but not on CompleteMultipartUpload.
            cause = exc.__cause__
            if not (extra and isinstance(cause, ClientError) and _code(cause) in _NOT_IMPLEMENTED):
                raise
            if self.head(key) is not None:
                raise ObjectExists(key) from exc
            return complete({})

    def _abort(self, full: str, upload_id: str) -> None:
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except (ClientError, BotoCoreError) as exc:  # the bucket lifecycle rule cleans up later
            log.warning("could not abort multipart upload %s of %s: %s", upload_id, full, exc)

    def delete(self, key: str) -> None:
        full = self._full(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if _code(exc) not in _NOT_FOUND:
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
        full = self._full(key)
        if if_absent and self.head(key) is not None:
            raise ObjectExists(key)  # fast path; the write itself is still conditional
        actual: list[ObjectInfo] = []
        for source in sources:
            info = self.head(source_key(source))
            if info is None:
                raise ObjectNotFound(source_key(source))
            check_expected(source, info)
            actual.append(info)
        total = sum(info.size for info in actual)
        unverified = any(
            isinstance(s, ObjectInfo) and s.sha256 and not a.sha256
            for s, a in zip(sources, actual, strict=True)
        )
        digest: str | None = None
        if sha256 or unverified:
            hasher = hashlib.sha256()
            for chunk in verified_source_stream(self, sources, actual):
                hasher.update(chunk)
            digest = hasher.hexdigest()

        plan = plan_compose([(a.key, a.size) for a in actual])
        etags = {a.key: a.etag for a in actual}
        if len(plan) <= 1 and not any(isinstance(p, CopyPart) for p in plan):
            body = b"".join(self._download(p, etags) for p in plan)
            result = self.put(key, body, if_absent=if_absent, sha256=digest)
        elif len(plan) > MAX_PARTS:
            # Thousands of tiny sources: stream them through a growing-part upload instead.
            stream = verified_source_stream(self, sources, actual)
            result = self.put(key, stream, if_absent=if_absent, sha256=digest)
        else:
            result = self._compose_multipart(key, full, plan, etags, if_absent, digest, total)
        if result.size != total:
            raise IntegrityError(f"compose {key}: wrote {result.size} bytes, sources sum {total}")
        return result

    def _download(self, part: Part, etags: dict[str, str | None]) -> bytes:
        """The bytes of a buffered part, each read pinned to the source ETag seen at head time."""
        assert isinstance(part, BufferedPart)
        pieces: list[bytes] = []
        for seg in part.segments:
            full = self._full(seg.key)
            opened = self._open_range(seg.key, full, seg.start, seg.end, etags.get(seg.key))
            if opened is None:
                raise IntegrityError(f"compose: source {seg.key} shrank below byte {seg.start}")
            stream = self._stream(seg.key, full, seg.start, seg.end, 1 << 20, *opened)
            pieces.append(b"".join(stream))
        return b"".join(pieces)

    def _compose_multipart(
        self,
        key: str,
        full: str,
        plan: list[Part],
        etags: dict[str, str | None],
        if_absent: bool,
        digest: str | None,
        total: int,
    ) -> ObjectInfo:
        extra = self._conditional(if_absent, key)
        metadata = {_METADATA_SHA256: digest} if digest else {}
        upload_id = self._call(
            "compose",
            key,
            lambda: self.client.create_multipart_upload(
                Bucket=self.bucket, Key=full, Metadata=metadata
            )["UploadId"],
        )
        parts: list[CompletedPartTypeDef] = []
        try:
            for number, part in enumerate(plan, start=1):
                if isinstance(part, CopyPart):
                    etag = self._copy_part(key, full, upload_id, number, part, etags)
                else:
                    body = self._download(part, etags)
                    if len(body) != part.size:
                        raise IntegrityError(f"compose {key}: part {number} read short")
                    etag = self._upload_part(key, full, upload_id, number, body)
                parts.append({"PartNumber": number, "ETag": etag})
            result_etag = self._complete(key, full, upload_id, parts, extra)
        except BaseException:
            self._abort(full, upload_id)
            raise
        head = self.head(key)
        if head is None or head.size != total:
            got = "nothing" if head is None else f"{head.size} bytes"
            if head is not None and head.etag == result_etag:
                self.delete(key)
            raise IntegrityError(f"compose {key}: store has {got}, sources sum {total}")
        return ObjectInfo(key=key, size=total, sha256=digest, etag=result_etag)

    def _copy_part(
        self,
        key: str,
        full: str,
        upload_id: str,
        number: int,
        part: CopyPart,
        etags: dict[str, str | None],
    ) -> str:
        seg = part.segment
        pin: dict[str, Any] = {}
        if etags.get(seg.key):
            pin["CopySourceIfMatch"] = etags[seg.key]
        try:
            response = self.client.upload_part_copy(
                Bucket=self.bucket,
                Key=full,
                UploadId=upload_id,
                PartNumber=number,
                CopySource={"Bucket": self.bucket, "Key": self.prefix + seg.key},
                CopySourceRange=f"bytes={seg.start}-{seg.end - 1}",
                **pin,
            )
        except ClientError as exc:
            code = _code(exc)
            if code in _PRECONDITION:
                raise IntegrityError(f"compose {key}: source {seg.key} changed") from exc
            if code in _NOT_FOUND:
                raise ObjectNotFound(seg.key) from exc
            self._raise(exc, "compose", key)
        except BotoCoreError as exc:
            self._raise(exc, "compose", key)
        return response["CopyPartResult"]["ETag"]

    # -- reads ------------------------------------------------------------------------------------

    def head(self, key: str) -> ObjectInfo | None:
        full = self._full(key)
        try:
            response = self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return None
            self._raise(exc, "head", key)
        except BotoCoreError as exc:
            self._raise(exc, "head", key)
        return ObjectInfo(
            key=key,
            size=response["ContentLength"],
            sha256=response.get("Metadata", {}).get(_METADATA_SHA256),
            etag=response.get("ETag"),
        )

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return b"".join(self.iter_range(key, start, end))

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
            code = _code(exc)
            if code in ("InvalidRange", "416"):
                return None  # the object exists and is no longer than start
            if code in _PRECONDITION:
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
