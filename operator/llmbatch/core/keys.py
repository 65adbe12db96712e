"""Object-store keys: derived from ids the system mints, never from a client's string."""

from __future__ import annotations

import hashlib
import secrets

FILES_PREFIX = "files/"
WORK_PREFIX = "work/"


def new_file_id() -> str:
    """A fresh, unguessable file id: ``file-`` + 32 hex (128 random bits)."""
    return "file-" + secrets.token_hex(16)


def derived_file_id(batch_uid: str, purpose: str) -> str:
    """Deterministic id of a batch's output or error file (finalisation can run twice)."""
    digest = hashlib.sha256(f"{batch_uid}\0{purpose}".encode()).hexdigest()[:32]
    return "file-" + digest


def file_key(namespace: str, file_id: str) -> str:
    """Where a file's bytes live."""
    return f"{FILES_PREFIX}{namespace}/{file_id}"


def owned_file_key(namespace: str, file_id: str, declared: str | None) -> str | None:
    """The key of a BatchFile's bytes, or None when its ``storageKey`` names another key.

    Keys are derived from the namespace and id, never trusted from the object: anyone who may
    create a BatchFile in one namespace must not reach bytes of another namespace through it.
    """
    key = file_key(namespace, file_id)
    return key if declared in (None, "", key) else None


def work_prefix(namespace: str, batch_uid: str) -> str:
    """The work area of one batch (inline input, shard specs, chunks); removed with the batch."""
    return f"{WORK_PREFIX}{namespace}/{batch_uid}"


INLINE_STAGING_PREFIX = "inline/"


def inline_staging_key(namespace: str, batch_id: str) -> str:
    """Where the gateway stores a batch's inline requests at creation, before the Batch (and
    its uid) exists: ``inline/<namespace>/<batch id>.jsonl``. The operator copies it into the
    batch's work area at acceptance and removes it; retention removes one whose Batch never
    came."""
    return f"{INLINE_STAGING_PREFIX}{namespace}/{batch_id}.jsonl"


ARCHIVE_PREFIX = "archive/"
ANNOTATION_ARCHIVED = "llmbatch.io/archived"
"""On a Batch: the archive key its final object was written to; it is being deleted."""


def archive_key(namespace: str, batch_id: str) -> str:
    """Where a finished Batch's final object is kept once it left the API server:
    ``archive/<namespace>/<batch id>.json`` (core/archive.py)."""
    return f"{ARCHIVE_PREFIX}{namespace}/{batch_id}.json"


TENANT_AREAS = {
    "archive": ARCHIVE_PREFIX,
    "files": FILES_PREFIX,
    "work": WORK_PREFIX,
    "inline": INLINE_STAGING_PREFIX,
}
"""Where a tenant's data lives, each under ``<prefix><namespace>/``: what offboarding erases."""


def tenant_area(area: str, namespace: str) -> str:
    """The prefix of one area (:data:`TENANT_AREAS`) of one namespace's data."""
    return f"{TENANT_AREAS[area]}{namespace}/"


TENANTS_PREFIX = "tenants/"
_GONE = ".gone-"


def tenant_key(namespace: str, uid: str, gone_at: int | None = None) -> str:
    """The operator's note of one namespace (by UID) whose data the store may hold:
    ``tenants/<namespace>/<uid>``, and once the namespace is gone
    ``tenants/<namespace>/<uid>.gone-<unix seconds>`` (a listing alone tells the offboarding
    sweep everything, ``core.offboarding``)."""
    note = f"{TENANTS_PREFIX}{namespace}/{uid}"
    return note if gone_at is None else f"{note}{_GONE}{gone_at}"


def parse_tenant_key(key: str) -> tuple[str, str, int | None] | None:
    """``(namespace, uid, gone_at)`` of a :func:`tenant_key`; None for any other key."""
    parts = key.removeprefix(TENANTS_PREFIX).split("/")
    if not key.startswith(TENANTS_PREFIX) or len(parts) != 2 or not all(parts):
        return None
    namespace, rest = parts
    uid, gone, when = rest.partition(_GONE)
    if not gone:
        return namespace, uid, None
    return (namespace, uid, int(when)) if when.isdigit() and uid else None


KEY_BINDINGS_PREFIX = "keybindings/"


def key_binding_key(secret_name: str) -> str:
    """Where the gateway keeps the namespace UID an API key without one in its Secret was bound
    to at its first use (``gateway.auth``)."""
    return f"{KEY_BINDINGS_PREFIX}{secret_name}.json"


def inline_input_key(namespace: str, batch_uid: str) -> str:
    """Where inline ``spec.requests`` are written as JSONL before validation."""
    return f"{work_prefix(namespace, batch_uid)}/input.jsonl"


def shard_plan_key(namespace: str, batch_uid: str) -> str:
    """Where a plan too long to list in the Batch's status is stored (core.shardbook)."""
    return f"{work_prefix(namespace, batch_uid)}/plan.json"


def shard_prefix(namespace: str, batch_uid: str, shard_index: int) -> str:
    """Output prefix of one shard's chunks and progress record."""
    return f"{work_prefix(namespace, batch_uid)}/shards/{shard_index:05d}"


def shard_spec_key(namespace: str, batch_uid: str, shard_index: int) -> str:
    """The shard spec the executor pod reads."""
    return f"{shard_prefix(namespace, batch_uid, shard_index)}/spec.json"


def namespace_of_shard_prefix(prefix: str) -> str:
    """The tenant namespace of a shard's output prefix (:func:`shard_prefix`)."""
    return prefix.split("/")[1]


def shard_lease_key(shard_output_prefix: str) -> str:
    """The lease (fencing token) beside a shard's results: only its holder commits chunks."""
    return f"{shard_output_prefix}/lease.json"


def shard_cancel_key(shard_output_prefix: str) -> str:
    """The cancel mark beside a shard's results: written by the operator before it takes a
    cancelled batch's shard back, so the slot lets the requests in the engine finish."""
    return f"{shard_output_prefix}/cancel.json"


def pool_slots_prefix(pool: str) -> str:
    """Every slot channel of one pool."""
    return f"slots/{pool}/"


def slot_prefix(pool: str, slot: str) -> str:
    """The channel of one warm slot: its assignments, heartbeat and drain request."""
    return f"{pool_slots_prefix(pool)}{slot}"


def slot_assignments_prefix(channel_prefix: str) -> str:
    """Where the operator writes one object per shard the slot should run."""
    return f"{channel_prefix}/assignments/"


def slot_assignment_key(channel_prefix: str, assignment_key: str) -> str:
    """One assignment object (``assignment_key`` is ``<batch-uid>-<shard index>``)."""
    return f"{slot_assignments_prefix(channel_prefix)}{assignment_key}.json"


def slot_heartbeat_key(channel_prefix: str) -> str:
    """The slot's heartbeat, rewritten every few seconds; a new ``seq`` renews its leases."""
    return f"{channel_prefix}/heartbeat.json"


def slot_drain_key(channel_prefix: str) -> str:
    """Present when the operator asks the slot to finish its shards and exit."""
    return f"{channel_prefix}/drain"


def slot_keep_key(channel_prefix: str) -> str:
    """Present while the operator wants the slot warm past its idle time (``minSlots``)."""
    return f"{channel_prefix}/keep"
