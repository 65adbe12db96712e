"""Offboarding: when a deleted tenant's data in the store is erased (pure).

Deleting a tenant namespace deletes its objects, not what it left in the store: archived batch
records, file bytes (a BatchFile has no finalizer), staged inline inputs and any work area. The
operator notes every namespace it sees in the store (``core.keys.tenant_key``: by name and UID),
notes when one is gone — deleted, or replaced by another namespace of the same name — and once
``grace_seconds`` have passed since, erases what the store holds of it and drops the note
(``controller.offboarding``). The grace period leaves time to export a tenant deleted by
mistake; the tenant's keys stopped working at the deletion (``core.identity``).

A namespace that is being deleted is gone from its ``deletionTimestamp`` on, but nothing is
erased while it still exists: its Batches' own clean-up runs first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from llmbatch.core.identity import NamespaceIdentity

DEFAULT_GRACE_SECONDS = 7 * 24 * 3600
"""How long a deleted tenant's data stays in the store by default."""


@dataclass(frozen=True)
class Incarnation:
    """One namespace (a name and a UID) the store's notes know of."""

    namespace: str
    uid: str
    gone_at: int | None = None
    """Unix seconds since when it is gone; None while it exists."""


@dataclass(frozen=True)
class Erasure:
    """A gone namespace whose data is due for erasure."""

    gone: Incarnation
    successor: NamespaceIdentity | None
    """The namespace of the same name that exists now (None: none): its data stays."""


@dataclass
class OffboardingPlan:
    """What one offboarding pass does."""

    register: list[Incarnation] = field(default_factory=list)
    """Namespaces without a note: note them (gone ones with their ``gone_at``)."""
    stamp: list[Incarnation] = field(default_factory=list)
    """Noted namespaces found gone: their note gets ``gone_at``."""
    erase: list[Erasure] = field(default_factory=list)
    """Gone for the grace period, and no longer present: erase their data, drop the note."""
    waiting: int = 0
    """Gone namespaces whose grace period runs."""


def _gone_at(note: Incarnation, present: NamespaceIdentity | None, now: int) -> int | None:
    """When a noted namespace went, as ``present`` (the namespace of its name now) shows it;
    None: it exists and is not being deleted."""
    if present is None or present.uid != note.uid:
        return now
    return present.deleted_at


def merge_notes(noted: Iterable[Incarnation]) -> dict[tuple[str, str], Incarnation]:
    """One incarnation per (namespace, UID): a note that it went wins over one that it exists
    (a pass cut short between the two writes leaves both), the earliest going over later ones."""
    known: dict[tuple[str, str], Incarnation] = {}
    for note in noted:
        held = known.get((note.namespace, note.uid))
        times = [t for t in (held.gone_at if held else None, note.gone_at) if t is not None]
        known[note.namespace, note.uid] = Incarnation(
            note.namespace, note.uid, min(times) if times else None
        )
    return known


def plan_offboarding(
    noted: Iterable[Incarnation],
    present: Mapping[str, NamespaceIdentity],
    seen: Iterable[NamespaceIdentity],
    now: int,
    grace_seconds: int,
) -> OffboardingPlan:
    """The pass at ``now``: ``noted`` from the store's notes, ``present`` the namespaces that
    exist (by name), ``seen`` those the watch showed since the last pass (one created and
    deleted in between is noted too)."""
    known = merge_notes(noted)
    plan = OffboardingPlan()
    for identity in [*present.values(), *seen]:
        if (identity.name, identity.uid) not in known:
            new = Incarnation(identity.name, identity.uid)
            note = replace(new, gone_at=_gone_at(new, present.get(identity.name), now))
            known[note.namespace, note.uid] = note
            plan.register.append(note)
    for note in known.values():
        current = present.get(note.namespace)
        gone_at = note.gone_at
        if gone_at is None and (gone_at := _gone_at(note, current, now)) is not None:
            plan.stamp.append(replace(note, gone_at=gone_at))
        if gone_at is None:
            continue
        replaced = current is None or current.uid != note.uid
        if replaced and now >= gone_at + grace_seconds:
            plan.erase.append(Erasure(replace(note, gone_at=gone_at), current))
        else:
            plan.waiting += 1
    return plan
