"""The boto3 S3 client of a store, and the S3 error codes the store tells apart."""

from __future__ import annotations

import base64
import functools
import hashlib
import threading
from typing import TYPE_CHECKING

import boto3
import botocore.config
from botocore.exceptions import ClientError

from llmbatch.storage.base import StoreError
from llmbatch.storage.config import S3Config, read_credentials

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

NOT_FOUND = frozenset({"NoSuchKey", "404", "NotFound"})
PRECONDITION = frozenset({"PreconditionFailed", "412"})
NOT_IMPLEMENTED = frozenset({"NotImplemented", "501"})
CONFLICT = frozenset({"ConditionalRequestConflict", "409"})
"""AWS answers 409 when two conditional writes to one key overlap; one of them will win, retry."""
METADATA_SHA256 = "sha256"
"""User metadata key (``x-amz-meta-sha256``) holding an object's sha256 when known."""


def error_code(exc: ClientError) -> str:
    """The S3 error code of a failed call, else its HTTP status as a string."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if not code:
        code = str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
    return code


def content_md5(data: bytes | memoryview) -> str:
    """The ``Content-MD5`` header of a request body."""
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
