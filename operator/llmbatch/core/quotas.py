"""A tenant's caps on what it keeps waiting and stored: its batches not yet finished, and the
bytes of its files. Each cap is the platform's default (the chart's ``quotas``) unless the
tenant's namespace annotation sets its own; the gateway refuses past them (429 / 400), the
operator checks the batch cap again at acceptance (the only check a kubectl Batch meets).

Pure: the callers count (the gateway from its listing caches, the operator from its batch cache)
and map a :class:`~llmbatch.core.admission.Refusal` to their answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch.core.admission import Refusal
from llmbatch.core.lifecycle import ACTIVE, TERMINAL

NAMESPACE_MAX_WAITING_BATCHES = "llmbatch.io/max-waiting-batches"
"""Namespace annotation: the most batches of the tenant not yet finished (0: none)."""
NAMESPACE_MAX_STORED_BYTES = "llmbatch.io/max-stored-bytes"
"""Namespace annotation: the most bytes the tenant's files may hold (0: no upload)."""

ACCEPTED_WAITING = ACTIVE - {"validating"}
"""The phases of a batch accepted and not finished."""

DEFAULT_MAX_WAITING_BATCHES = 1000
"""The chart's default cap on a tenant's unfinished batches."""
DEFAULT_MAX_STORED_BYTES = 100 * 1024**3
"""The chart's default cap on a tenant's stored file bytes (100 GiB)."""


@dataclass(frozen=True)
class TenantCaps:
    """One tenant's caps; None: no cap."""

    waiting_batches: int | None = None
    stored_bytes: int | None = None

    @classmethod
    def of(cls, annotations: Mapping[str, str], default: TenantCaps) -> TenantCaps:
        """The caps a namespace's annotations set, the ``default`` ones where they set none (a
        value that is not a whole number is ignored)."""
        batches = _annotated(annotations, NAMESPACE_MAX_WAITING_BATCHES)
        stored = _annotated(annotations, NAMESPACE_MAX_STORED_BYTES)
        return cls(
            waiting_batches=default.waiting_batches if batches is None else batches,
            stored_bytes=default.stored_bytes if stored is None else stored,
        )

    @classmethod
    def defaults(cls, waiting_batches: int, stored_bytes: int) -> TenantCaps:
        """The platform's defaults from its settings, where 0 means no cap."""
        return cls(waiting_batches or None, stored_bytes or None)


def _annotated(annotations: Mapping[str, str], key: str) -> int | None:
    raw = annotations.get(key, "").strip()
    return int(raw) if raw.isdigit() else None


def waiting(batch: Mapping[str, Any]) -> bool:
    """Whether a Batch object counts against the cap: it has not finished."""
    return (batch.get("status") or {}).get("status") not in TERMINAL


def accepted_waiting(batch: Mapping[str, Any]) -> bool:
    """Whether a Batch object counts at the operator's check at acceptance: accepted and not
    finished (a batch still validating is decided in its own turn)."""
    return (batch.get("status") or {}).get("status") in ACCEPTED_WAITING


def count_accepted_waiting(batches: Iterable[Mapping[str, Any]]) -> int:
    return sum(1 for batch in batches if accepted_waiting(batch))


def check_waiting_batches(waiting_now: int, limit: int | None) -> Refusal | None:
    """One more batch on top of ``waiting_now`` unfinished ones, against the cap."""
    if limit is None or waiting_now + 1 <= limit:
        return None
    return Refusal(
        "over_quota",
        "too_many_batches",
        f"Waiting batch limit reached: {waiting_now} of your batches have not finished and "
        f"the limit for your organization is {limit}. Retry after some batches complete.",
    )


def storage_room(stored: int, limit: int | None) -> int | None:
    """Bytes the tenant may still store (None: no cap)."""
    return None if limit is None else max(0, limit - stored)


def storage_refusal(stored: int, limit: int) -> Refusal:
    """The answer to an upload that would take the tenant's files past its cap (400: no retry
    helps until files are deleted or expire)."""
    return Refusal(
        "too_large",
        "storage_quota_exceeded",
        f"File storage limit reached: your organization's files hold {stored} bytes and the "
        f"limit is {limit} bytes; this upload would pass it. Delete files you no longer need "
        "(DELETE /v1/files/{file_id}), or wait for them to expire.",
        "file",
    )
