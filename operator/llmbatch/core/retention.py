"""File retention: which stored files and work areas are due for deletion at a given time.

Pure: the operator's sweep lists BatchFiles, Batches and pool settings, hands them in with the
clock, and gets back what to delete and which expiry to show. The rules (docs/operations.md):

- an input no batch has accepted expires ``unused_input_seconds`` after upload (24 h), or earlier
  when the file itself asks for less (``spec.expiresAt``); a lifetime the uploader chose
  (OpenAI's ``expires_after``, ``spec.expiresAfterSeconds``: 1 h to 30 days) replaces the default,
  longer or shorter, and also caps how long an accepted input is kept after its batches;
- an accepted input (a batch referencing it passed validation) is deleted once every batch using
  it has finished, ``input_after_batch_seconds`` later (0), and at most ``accepted_input_seconds``
  after the first acceptance (48 h);
- output and error files expire at the ``spec.expiresAt`` fixed when finalisation wrote them
  (7 days, a pool's ``outputSeconds``, or the batch's ``outputExpiresAfterSeconds``);
- a finished batch's work area (inline input, shard specs, chunks, progress) is removed once.

Nothing a non-terminal batch references (its input, its result files) is ever due, whatever the
clocks say, and nothing a batch used goes before ``SETTLE_SECONDS`` after the batch finished: a
reconcile still holding the batch's pre-terminal body must not find its inputs gone.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from llmbatch.api.resources import PoolRetention
from llmbatch.core import keys
from llmbatch.core.ids import batch_id_from_name, batch_object_name
from llmbatch.core.keys import ANNOTATION_ARCHIVED
from llmbatch.core.lifecycle import TERMINAL, unix_seconds
from llmbatch.core.webhooks import DELIVERIES_ANNOTATION, Deliveries

HOUR = 3600
DAY = 24 * HOUR
SETTLE_SECONDS = 30
"""Nothing a batch used is removed sooner than this after the batch finished."""
MAX_USED_BY = 64
"""``status.usedBy`` lists at most this many batches (the CRD's bound)."""

Rule = Literal["unused_input", "accepted_input", "output"]
_FINISHED_AT = {
    "completed": "completedAt",
    "failed": "failedAt",
    "expired": "expiredAt",
    "cancelled": "cancelledAt",
}


@dataclass(frozen=True)
class RetentionPolicy:
    """How long files are kept; the operator-wide defaults, or one pool's view of them."""

    unused_input_seconds: int = DAY
    """An input no batch accepted: lifetime from upload."""
    accepted_input_seconds: int = 2 * DAY
    """An accepted input: most seconds kept after the first acceptance."""
    input_after_batch_seconds: int = 0
    """An accepted input: seconds kept after the last batch using it finished."""
    output_seconds: int = 7 * DAY
    """Output and error files: lifetime from creation unless the batch says otherwise."""
    batch_seconds: int | None = None
    """A finished Batch object: seconds it stays in the API server after it finished, then it
    is archived in the store (``ttlSecondsAfterFinished``); None: until its results expire."""

    def for_pool(self, pool: PoolRetention | None) -> RetentionPolicy:
        """These defaults with a pool's settings on top (unset pool fields keep the default)."""
        if pool is None:
            return self
        return replace(
            self,
            accepted_input_seconds=_pick(pool.accepted_input_seconds, self.accepted_input_seconds),
            input_after_batch_seconds=_pick(
                pool.input_after_batch_seconds, self.input_after_batch_seconds
            ),
            output_seconds=_pick(pool.output_seconds, self.output_seconds),
            batch_seconds=self.batch_seconds if pool.batch_seconds is None else pool.batch_seconds,
        )


def _pick(value: int | None, default: int) -> int:
    return default if value is None else value


def output_expires_at(
    created_at: int,
    batch_seconds: int | None,
    pool: PoolRetention | None,
    default: RetentionPolicy,
) -> int:
    """``expiresAt`` of a new output or error file: the batch's wish, else the pool's, else 7 d."""
    if batch_seconds is not None:
        return created_at + batch_seconds
    return created_at + default.for_pool(pool).output_seconds


# --- what the sweep sees ----------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _created(meta: Mapping[str, Any]) -> int:
    stamp = _str(meta.get("creationTimestamp"))
    try:
        return unix_seconds(stamp) if stamp else 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class StoredFile:
    """The retention-relevant facts of one BatchFile."""

    namespace: str
    name: str
    """Object name = OpenAI file id."""
    uid: str
    purpose: str
    storage_key: str
    bytes: int
    created_at: int
    requested_expires_at: int | None
    """``spec.expiresAt``: what the uploader (or finalisation) set."""
    shown_expires_at: int | None
    """``status.expiresAt``: what the operator last published."""
    used_by: tuple[str, ...]
    """``status.usedBy`` as last published."""
    requested_lifetime: int | None = None
    """``spec.expiresAfterSeconds``: the lifetime from ``created_at`` the uploader asked for."""

    @property
    def asked_expiry(self) -> int | None:
        """When the uploader asked the file to expire (None: it did not choose)."""
        if self.requested_lifetime is None:
            return None
        return self.created_at + self.requested_lifetime

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> StoredFile:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        used_by = status.get("usedBy")
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            purpose=str(spec.get("purpose") or ""),
            storage_key=str(spec.get("storageKey") or ""),
            bytes=_int(spec.get("bytes")) or 0,
            created_at=_int(spec.get("createdAt")) or _created(meta),
            requested_expires_at=_int(spec.get("expiresAt")),
            shown_expires_at=_int(status.get("expiresAt")),
            used_by=tuple(str(b) for b in used_by) if isinstance(used_by, list) else (),
            requested_lifetime=_int(spec.get("expiresAfterSeconds")),
        )


@dataclass(frozen=True)
class BatchRef:
    """The retention-relevant facts of one Batch."""

    namespace: str
    name: str
    uid: str
    phase: str | None
    """``status.status``; None before the operator first wrote it (the batch is active)."""
    input_file_id: str | None
    result_file_ids: tuple[str, ...]
    """``status.outputFileID`` and ``status.errorFileID`` when set."""
    accepted_at: int | None
    """Unix seconds validation accepted the input (``inProgressAt`` with ``inputKey`` set)."""
    window_end: int | None
    """``status.expiresAt``: the end of the completion window."""
    finished_at: int | None
    """When the batch reached its terminal status."""
    pool: str | None
    work_removed: bool
    """``status.workRemovedAt`` is set."""
    output_seconds: int | None = None
    """``spec.outputExpiresAfterSeconds``: the lifetime of its results the client asked for."""
    archived: bool = False
    """Archived in the store (``llmbatch.io/archived``): its deletion is under way."""
    webhooks_pending: bool = False
    """A webhook delivery of its end is still to be attempted (the record is on the object)."""

    @property
    def active(self) -> bool:
        """Not finished: everything it references is in use."""
        return self.phase not in TERMINAL

    @property
    def batch_id(self) -> str:
        # The CRD only admits batch-* names; an object from before that rule must not stop
        # the sweep for every tenant, so it shows under its object name.
        return batch_id_from_name(self.name) if self.name.startswith("batch-") else self.name

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> BatchRef:
        meta = obj.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        phase = _str(status.get("status"))
        accepted = _int(status.get("inProgressAt")) if _str(status.get("inputKey")) else None
        finished = _int(status.get(_FINISHED_AT[phase])) if phase in _FINISHED_AT else None
        results = (_str(status.get("outputFileID")), _str(status.get("errorFileID")))
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            phase=phase,
            input_file_id=_str(spec.get("inputFileID")),
            result_file_ids=tuple(r for r in results if r),
            accepted_at=accepted,
            window_end=_int(status.get("expiresAt")),
            finished_at=finished,
            pool=_str(status.get("pool")),
            work_removed=_int(status.get("workRemovedAt")) is not None,
            output_seconds=_int(spec.get("outputExpiresAfterSeconds")),
            archived=bool(_str(annotations.get(ANNOTATION_ARCHIVED))),
            webhooks_pending=_webhooks_pending(annotations.get(DELIVERIES_ANNOTATION)),
        )


def _webhooks_pending(raw: Any) -> bool:
    if not isinstance(raw, str) or not raw:
        return False
    try:
        return bool(Deliveries.model_validate_json(raw).pending())
    except ValueError:
        return False  # unreadable: the dispatcher reports it; retention does not wait on it


# --- decisions --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileDecision:
    """What retention makes of one file now."""

    file: StoredFile
    rule: Rule
    expires_at: int
    """When the file is (or was) due; what its File object's expires_at shows."""
    in_use: bool
    """A non-terminal batch references it: kept whatever the clock says."""
    due: bool
    """Delete it now (bytes, then the BatchFile)."""
    used_by: tuple[str, ...]
    """Ids of the batches that reference it (for ``status.usedBy``)."""

    @property
    def status_stale(self) -> bool:
        """The File object would show another expiry, or the user list changed."""
        shown = self.file.shown_expires_at
        if shown is None:
            shown = self.file.requested_expires_at
        return shown != self.expires_at or self.file.used_by != self.used_by


PolicyOf = Mapping[str | None, RetentionPolicy]


def _policy(policies: PolicyOf, default: RetentionPolicy, pool: str | None) -> RetentionPolicy:
    return policies.get(pool, default)


def decide_file(
    file: StoredFile,
    refs: Sequence[BatchRef],
    default: RetentionPolicy,
    policies: PolicyOf,
    now: float,
) -> FileDecision | None:
    """Retention of one file given the batches referencing it; None for an unknown purpose."""
    in_use = any(r.active for r in refs)
    used_by = tuple(sorted({r.batch_id for r in refs}))[:MAX_USED_BY]
    rule: Rule
    if file.purpose == "batch_output":
        rule = "output"
        expires = file.requested_expires_at
        if expires is None:
            expires = file.created_at + default.output_seconds
        finished = [r.finished_at for r in refs if not r.active and r.finished_at is not None]
        if finished:
            expires = max(expires, max(finished) + SETTLE_SECONDS)
    elif file.purpose == "batch":
        accepted = sorted(
            (r for r in refs if r.accepted_at is not None), key=lambda r: r.accepted_at or 0
        )
        if accepted:
            rule = "accepted_input"
            expires = _accepted_input_expiry(accepted, default, policies, file.asked_expiry)
        else:
            rule = "unused_input"
            asked = file.asked_expiry
            if asked is not None:
                expires = asked  # the uploader's choice, longer or shorter than the default
            else:
                expires = file.created_at + default.unused_input_seconds
                if file.requested_expires_at is not None:
                    expires = min(expires, file.requested_expires_at)
    else:
        return None
    due = not in_use and now >= expires
    return FileDecision(file, rule, expires, in_use, due, used_by)


def _accepted_input_expiry(
    accepted: Sequence[BatchRef],
    default: RetentionPolicy,
    policies: PolicyOf,
    asked: int | None,
) -> int:
    first = accepted[0]
    first_policy = _policy(policies, default, first.pool)
    bound = (first.accepted_at or 0) + first_policy.accepted_input_seconds
    running = [r for r in accepted if r.active]
    if running:
        # Kept while a batch runs on it; the best guess of the end is its window's end (the 24 h
        # window normally closes before the 48 h bound; a 72 h flex window does not).
        ends = [r.window_end for r in running if r.window_end is not None]
        return max([bound, *ends])
    last = max(accepted, key=lambda r: r.finished_at or r.accepted_at or 0)
    last_end = last.finished_at or last.accepted_at or 0
    after = last_end + _policy(policies, default, last.pool).input_after_batch_seconds
    due = min(bound, after) if asked is None else min(bound, after, asked)
    return max(due, last_end + SETTLE_SECONDS)


def work_area_due(batch: BatchRef, now: float) -> bool:
    """A finished batch's work area is removed once, shortly after it finished."""
    if batch.active or batch.work_removed:
        return False
    return batch.finished_at is None or now >= batch.finished_at + SETTLE_SECONDS


def batch_leaves_at(batch: BatchRef, policy: RetentionPolicy) -> int | None:
    """When a finished Batch object leaves the API server for the archive: ``batch_seconds``
    after it finished, by default when its results expire (the batch's own output lifetime,
    else the pool's); None while it runs."""
    if batch.active or batch.finished_at is None:
        return None
    if policy.batch_seconds is not None:
        return batch.finished_at + policy.batch_seconds
    return batch.finished_at + (batch.output_seconds or policy.output_seconds)


def batch_archive_due(batch: BatchRef, policy: RetentionPolicy, now: float) -> bool:
    """Archive and delete the Batch now: finished, its work area removed (so its deletion
    has nothing left to clean), no webhook delivery of its end pending (their record is on the
    object), past its time — or archived already (a sweep cut short)."""
    if batch.active or not batch.work_removed or batch.webhooks_pending:
        return False
    leaves = batch_leaves_at(batch, policy)
    return batch.archived or (leaves is not None and now >= leaves)


@dataclass
class RetentionPlan:
    """What one sweep should do."""

    delete: list[FileDecision]
    """Files due now."""
    publish: list[FileDecision]
    """Files kept whose ``status.expiresAt`` / ``status.usedBy`` should change."""
    clean_work: list[BatchRef]
    """Finished batches whose work area goes now."""
    archive: list[BatchRef] = field(default_factory=list)
    """Finished batches whose object goes to the archive now (``batch_archive_due``)."""
    unclaimed: list[str] = field(default_factory=list)
    """Staged inline inputs (``core.keys.inline_staging_key``) no unfinished Batch will read: the
    gateway stored them and then did not create the Batch, it was deleted before validation, or
    it failed validation (acceptance pins the input and removes the staged copy itself)."""


def plan_retention(
    files: Iterable[StoredFile],
    batches: Iterable[BatchRef],
    default: RetentionPolicy,
    pools: Mapping[str, PoolRetention | None],
    now: float,
    staged: Iterable[str] = (),
) -> RetentionPlan:
    """Everything due at ``now``; running it twice over the result of the first is a no-op.
    ``staged``: the keys of the staged inline inputs in the store."""
    policies: dict[str | None, RetentionPolicy] = {
        name: default.for_pool(settings) for name, settings in pools.items()
    }
    refs: defaultdict[tuple[str, str], list[BatchRef]] = defaultdict(list)
    batch_list = list(batches)
    for batch in batch_list:
        if batch.input_file_id:
            refs[batch.namespace, batch.input_file_id].append(batch)
        for file_id in batch.result_file_ids:
            refs[batch.namespace, file_id].append(batch)
    plan = RetentionPlan(delete=[], publish=[], clean_work=[])
    for file in files:
        decision = decide_file(
            file, refs.get((file.namespace, file.name), ()), default, policies, now
        )
        if decision is None:
            continue
        if decision.due:
            plan.delete.append(decision)
        elif decision.status_stale:
            plan.publish.append(decision)
    plan.clean_work = [b for b in batch_list if work_area_due(b, now)]
    plan.archive = [
        b for b in batch_list if batch_archive_due(b, _policy(policies, default, b.pool), now)
    ]
    # a finished batch never reads its staged input (one that failed validation kept it)
    named = {(b.namespace, b.name) for b in batch_list if b.active}
    plan.unclaimed = [key for key in staged if (owner := _staged_for(key)) and owner not in named]
    return plan


def _staged_for(key: str) -> tuple[str, str] | None:
    """(namespace, Batch name) a staged inline input was stored for."""
    parts = key.removeprefix(keys.INLINE_STAGING_PREFIX).split("/")
    if len(parts) != 2 or not parts[1].endswith(".jsonl"):
        return None
    batch_id = parts[1].removesuffix(".jsonl")
    if not batch_id.startswith("batch_"):
        return None
    return parts[0], batch_object_name(batch_id)
