"""Object store: one interface, S3 and filesystem implementations."""

from __future__ import annotations

from llmbatch.storage.base import (
    IntegrityError,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    validate_key,
)
from llmbatch.storage.config import (
    FilesystemConfig,
    S3Config,
    StoreSettings,
    parse_store_uri,
)
from llmbatch.storage.filesystem import FilesystemStore

__all__ = [
    "FilesystemStore",
    "IntegrityError",
    "InvalidKey",
    "ObjectChanged",
    "ObjectExists",
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "StoreError",
    "StoreSettings",
    "open_store",
    "parse_store_uri",
    "validate_key",
]


def open_store(uri: str) -> ObjectStore:
    """Open the store a URI names (grammar in :mod:`llmbatch.storage.config`, docs/storage.md).

    ``file:///abs/path`` (or a bare ``/abs/path``) opens a :class:`FilesystemStore`;
    ``s3://bucket/optional/prefix?endpoint_url=...&region=...&path_style=true&secret_dir=...``
    opens an ``S3Store``. Raises ValueError for a malformed URI; no network call is made.
    """
    config = parse_store_uri(uri)
    if isinstance(config, FilesystemConfig):
        return FilesystemStore(config.root)
    return open_s3_store(config)


def open_s3_store(config: S3Config) -> ObjectStore:
    """An ``S3Store`` for ``config`` (boto3 is imported only when an S3 store is opened)."""
    from llmbatch.storage.s3 import S3Store

    return S3Store(config)
