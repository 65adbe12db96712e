"""The BatchFile resource: metadata of a file whose bytes live in the object store."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from llmbatch.api.resources.base import Conditions, CRModel
from llmbatch.api.resources.fields import ObjectID, Sha256, ShortText, StoreKey


class FileMedia(CRModel):
    """The image and audio parts of an input's requests (for credit estimates)."""

    images: int = 0
    """Image parts."""
    audio_clips: int = 0
    """Audio parts."""
    audio_bytes: int = 0
    """Decoded bytes of the inline audio."""
    encoded_bytes: int = 0
    """Bytes of the file that are base64 media (not text)."""


class BatchFileSpec(CRModel):
    """Metadata of a stored file; the bytes live in the object store."""

    id: ObjectID
    """OpenAI file id, file-<32 hex>."""
    bytes: int
    """Size in bytes."""
    filename: Annotated[str, StringConstraints(max_length=512)]
    """The name the client gave (never used as a storage key)."""
    purpose: Literal["batch", "batch_output"]
    """batch for inputs, batch_output for output and error files."""
    sha256: Sha256 | None = None
    """SHA-256 of the bytes."""
    line_count: int | None = None
    """Requests in the file (inputs)."""
    model: ShortText | None = None
    """The model every request names (inputs)."""
    output_token_limits: int | None = None
    """Sum of the output-token limits the requests declare (inputs; for credit estimates)."""
    requests_without_output_limit: int | None = None
    """Requests that declare no output-token limit (inputs; the pool default is assumed)."""
    media: FileMedia | None = None
    """The image and audio parts of the requests (inputs that have any)."""
    storage_key: StoreKey
    """Key of the bytes in the object store, derived from the id."""
    created_at: int
    """Unix seconds: upload or creation."""
    expires_at: int | None = None
    """Unix seconds: expiry set at creation; an input may ask for less than the 24 h default."""
    expires_after_seconds: Annotated[int, Field(ge=3600, le=2592000)] | None = None
    """Lifetime the uploader asked for (OpenAI expires_after, anchor created_at): an unused input
    then expires this long after createdAt instead of after the 24 h default."""


class BatchFileStatus(CRModel):
    """Observed state of a file."""

    status: Literal["uploaded", "processed", "error"] = "processed"
    """OpenAI file status."""
    used_by: Annotated[list[ObjectID], Field(max_length=64)] | None = None
    """Batches that reference this file (retention keeps it while any runs)."""
    expires_at: int | None = None
    """Unix seconds: when retention plans to delete the file (the File object's expires_at)."""
    conditions: Conditions | None = None
    """Conditions."""
