"""S3 multipart uploads: one upload's parts, completion and abort, and the streamed put."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from llmbatch.storage.base import (
    IntegrityError,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    StoreError,
)
from llmbatch.storage.config import MAX_PARTS
from llmbatch.storage.parts import CopyPart, streamed_part_size
from llmbatch.storage.s3client import (
    METADATA_SHA256,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION,
    content_md5,
    error_code,
)

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

    from llmbatch.storage.s3 import S3Store

log = logging.getLogger(__name__)


class MultipartUpload:
    """One multipart upload of ``key``: parts added in order, then completed or aborted."""

    def __init__(self, store: S3Store, key: str, full: str, upload_id: str) -> None:
        self.store = store
        self.key = key
        self.full = full
        self.upload_id = upload_id
        self.parts: list[CompletedPartTypeDef] = []

    @classmethod
    def start(
        cls, store: S3Store, op: str, key: str, full: str, metadata: dict[str, str]
    ) -> MultipartUpload:
        """Create the upload (``op`` names the store operation in errors)."""
        upload_id = store._call(
            op,
            key,
            lambda: store.client.create_multipart_upload(
                Bucket=store.bucket,
                Key=full,
                Metadata=metadata,
                # the whole object's encryption is set here: UploadPart and UploadPartCopy take
                # SSE-C headers only, never SSE-S3 / SSE-KMS ones (S3 refuses them there)
                **store.config.encryption_args(),  # type: ignore[arg-type]
            )["UploadId"],
        )
        return cls(store, key, full, upload_id)

    def upload_part(self, body: bytes) -> None:
        """Upload the next part from bytes we hold (with Content-MD5)."""
        number = len(self.parts) + 1
        response = self.store._call(
            "upload part",
            self.key,
            lambda: self.store.client.upload_part(
                Bucket=self.store.bucket,
                Key=self.full,
                UploadId=self.upload_id,
                PartNumber=number,
                Body=body,
                ContentMD5=content_md5(body),
            ),
        )
        self.parts.append({"PartNumber": number, "ETag": response["ETag"]})

    def copy_part(self, part: CopyPart, etags: dict[str, str | None]) -> None:
        """Have the server copy the next part from a source range, pinned to the source ETag."""
        store, seg = self.store, part.segment
        number = len(self.parts) + 1
        pin: dict[str, Any] = {}
        if etags.get(seg.key):
            pin["CopySourceIfMatch"] = etags[seg.key]
        try:
            response = store.client.upload_part_copy(
                Bucket=store.bucket,
                Key=self.full,
                UploadId=self.upload_id,
                PartNumber=number,
                CopySource={"Bucket": store.bucket, "Key": store.prefix + seg.key},
                CopySourceRange=f"bytes={seg.start}-{seg.end - 1}",
                **pin,
            )
        except ClientError as exc:
            code = error_code(exc)
            if code in PRECONDITION:
                raise IntegrityError(f"compose {self.key}: source {seg.key} changed") from exc
            if code in NOT_FOUND:
                raise ObjectNotFound(seg.key) from exc
            store._raise(exc, "compose", self.key)
        except BotoCoreError as exc:
            store._raise(exc, "compose", self.key)
        self.parts.append({"PartNumber": number, "ETag": response["CopyPartResult"]["ETag"]})

    def complete(self, extra: dict[str, str]) -> str | None:
        """Complete the upload (conditionally when ``extra`` says so); the new object's ETag."""
        try:
            return self._complete(extra)
        except StoreError as exc:
            # Some servers take If-None-Match on PutObject but not on CompleteMultipartUpload.
            cause = exc.__cause__
            if not (
                extra and isinstance(cause, ClientError) and error_code(cause) in NOT_IMPLEMENTED
            ):
                raise
            if self.store.head(self.key) is not None:
                raise ObjectExists(self.key) from exc
            return self._complete({})

    def _complete(self, conditional: dict[str, str]) -> str | None:
        store = self.store
        response = store._retry_conflicts(
            "complete",
            self.key,
            lambda: store.client.complete_multipart_upload(
                Bucket=store.bucket,
                Key=self.full,
                UploadId=self.upload_id,
                MultipartUpload={"Parts": self.parts},
                **conditional,  # type: ignore[arg-type]
            ),
        )
        return response.get("ETag")

    def abort(self) -> None:
        """Abort the upload; a failure is only logged (the bucket lifecycle rule cleans up)."""
        store = self.store
        try:
            store.client.abort_multipart_upload(
                Bucket=store.bucket, Key=self.full, UploadId=self.upload_id
            )
        except (ClientError, BotoCoreError) as exc:
            log.warning(
                "could not abort multipart upload %s of %s: %s", self.upload_id, self.full, exc
            )


def put_streamed(
    store: S3Store,
    key: str,
    full: str,
    buffer: bytearray,
    rest: Iterator[bytes],
    extra: dict[str, str],
    expected: str | None,
) -> ObjectInfo:
    """Upload ``buffer`` and then ``rest`` in growing parts; aborted on any failure."""
    if extra and store.head(key) is not None:
        raise ObjectExists(key)  # fail before uploading parts that could never be completed
    metadata = {METADATA_SHA256: expected} if expected else {}
    upload = MultipartUpload.start(store, "put", key, full, metadata)
    hasher = hashlib.sha256()
    size = 0

    def send(body: bytes) -> None:
        nonlocal size
        if len(upload.parts) + 1 > MAX_PARTS:
            raise StoreError(f"put {key}: more than {MAX_PARTS} parts")
        hasher.update(body)
        size += len(body)
        upload.upload_part(body)

    def drain() -> None:
        # Upload whole parts while more than one part is buffered; the rest waits for data.
        part_size = store.config.part_size
        while len(buffer) > (part := streamed_part_size(len(upload.parts) + 1, part_size)):
            send(bytes(buffer[:part]))
            del buffer[:part]

    try:
        drain()
        for chunk in rest:
            buffer += chunk
            drain()
        send(bytes(buffer))
        del buffer[:]
        digest = hasher.hexdigest()
        if expected is not None and digest != expected:
            raise IntegrityError(f"put {key}: data sha256 {digest} != expected {expected}")
        etag = upload.complete(extra)
    except BaseException:
        upload.abort()
        raise
    return ObjectInfo(key=key, size=size, sha256=digest, etag=etag)
