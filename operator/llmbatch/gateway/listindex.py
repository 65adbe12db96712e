"""The listing index: each tenant's batches or files in list order, paged in O(log n + page).

Pure (no I/O): :mod:`llmbatch.gateway.listcache` feeds it from a watch, the list routes read it.
Per tenant namespace the entries are kept ascending by their sort key (``created_ns``, name: the
keys the routes sorted by before, so the order is the same); a newest-first page walks down from
the cursor, an oldest-first page walks up. Each entry holds the object already mapped to its
OpenAI form, so a page costs its own items and nothing of the tenant's history.

The cursor (``after``, an id the client got from an earlier page) is resolved to its sort key: in
the live entries, or in the tombstones of entries removed while the index held them, so a client
paging while retention deletes files continues strictly after where that item was. An id the
index never held in that namespace (another tenant's included) is :class:`CursorNotFound`.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from llmbatch.gateway.mapping import CursorNotFound

SortKey = tuple[int, str]
TOMBSTONE_SECONDS = 86400.0
"""How long a removed entry still resolves as a cursor (a day: any paging client is done)."""
TOMBSTONES_PER_NAMESPACE = 10_000
"""At most this many tombstones per tenant (the oldest go first): memory stays bounded."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed object: its OpenAI id, its place in the list, and its wire form."""

    id: str
    key: SortKey
    data: dict[str, Any]
    """The OpenAI object as JSON types, mapped once when the object changed."""
    group: str | None = None
    """A sub-list the entry is also in (a file's purpose), so a filtered page is O(page) too."""
    version: int | None = None
    """The object's resourceVersion, when it is a number (the cache orders writes by it)."""
    archived: bool = False
    """Its record is in the archive (a finished batch): it stays listed once its object goes."""
    weight: int = 0
    """What it counts toward its tenant's quota total (:meth:`ListIndex.total`): 1 for a batch
    not finished, a file's bytes."""


class _Ordered:
    """Entries of one list, ascending by sort key (keys are unique: the name is in them)."""

    __slots__ = ("by_key", "keys")

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self.by_key: dict[SortKey, Entry] = {entry.key: entry for entry in entries}
        self.keys: list[SortKey] = sorted(self.by_key)

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, entry: Entry) -> None:
        if entry.key not in self.by_key:
            # Binary search, then one memmove of a pointer array: microseconds at 10,000.
            insort(self.keys, entry.key)
        self.by_key[entry.key] = entry

    def discard(self, key: SortKey) -> None:
        if self.by_key.pop(key, None) is not None:
            del self.keys[bisect_left(self.keys, key)]

    def page(
        self, cursor: SortKey | None, limit: int, descending: bool
    ) -> tuple[list[Entry], bool]:
        """Up to ``limit`` entries strictly after ``cursor`` in list order, and whether more."""
        if descending:
            end = len(self.keys) if cursor is None else bisect_left(self.keys, cursor)
            start = max(0, end - limit)
            keys = self.keys[start:end]
            keys.reverse()
            return [self.by_key[k] for k in keys], start > 0
        begin = 0 if cursor is None else bisect_right(self.keys, cursor)
        keys = self.keys[begin : begin + limit]
        return [self.by_key[k] for k in keys], begin + limit < len(self.keys)


@dataclass
class _Tenant:
    live: dict[str, Entry] = field(default_factory=dict)
    lists: dict[str | None, _Ordered] = field(default_factory=dict)
    """``None``: every entry; a group name: the entries of that group."""
    gone: OrderedDict[str, tuple[SortKey, float]] = field(default_factory=OrderedDict)
    """Tombstones: id → (sort key, when removed), oldest first."""
    total: int = 0
    """The weights of the live entries."""

    def listed(self, group: str | None) -> _Ordered:
        found = self.lists.get(group)
        if found is None:
            found = self.lists[group] = _Ordered()
        return found

    def add(self, entry: Entry) -> None:
        self.listed(None).add(entry)
        if entry.group is not None:
            self.listed(entry.group).add(entry)
        old = self.live.get(entry.id)
        self.total += entry.weight - (old.weight if old is not None else 0)
        self.live[entry.id] = entry

    def discard(self, entry: Entry) -> None:
        self.listed(None).discard(entry.key)
        if entry.group is not None:
            self.listed(entry.group).discard(entry.key)
        del self.live[entry.id]
        self.total -= entry.weight


class ListIndex:
    """Every tenant's entries of one kind; ``clock`` dates tombstones (seconds)."""

    def __init__(
        self,
        tombstone_seconds: float = TOMBSTONE_SECONDS,
        tombstones_per_namespace: int = TOMBSTONES_PER_NAMESPACE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tombstone_seconds = tombstone_seconds
        self.tombstones_per_namespace = tombstones_per_namespace
        self.clock = clock
        self._tenants: dict[str, _Tenant] = {}

    def __len__(self) -> int:
        return sum(len(t.live) for t in self._tenants.values())

    def get(self, namespace: str, ident: str) -> Entry | None:
        tenant = self._tenants.get(namespace)
        return tenant.live.get(ident) if tenant is not None else None

    def total(self, namespace: str) -> int:
        """The weights of the tenant's live entries: its unfinished batches, or its files'
        bytes (O(1), kept as entries come and go)."""
        tenant = self._tenants.get(namespace)
        return tenant.total if tenant is not None else 0

    def items(self) -> Iterator[tuple[str, Entry]]:
        """Every live ``(namespace, entry)``."""
        for namespace, tenant in self._tenants.items():
            for entry in tenant.live.values():
                yield namespace, entry

    def put(self, namespace: str, entry: Entry) -> None:
        """Insert or update (O(log n); O(1) when the sort key and group are unchanged)."""
        tenant = self._tenants.setdefault(namespace, _Tenant())
        old = tenant.live.get(entry.id)
        if old is not None and (old.key != entry.key or old.group != entry.group):
            tenant.discard(old)
        tenant.add(entry)
        tenant.gone.pop(entry.id, None)  # back again (a name reused): live wins

    def remove(self, namespace: str, ident: str) -> bool:
        """Drop an entry, keeping a tombstone so a cursor naming it still pages on."""
        tenant = self._tenants.get(namespace)
        entry = tenant.live.get(ident) if tenant is not None else None
        if tenant is None or entry is None:
            return False
        tenant.discard(entry)
        self._bury(tenant, entry, self.clock())
        return True

    def replace(self, entries: Iterable[tuple[str, Entry]]) -> None:
        """The whole index from a fresh listing: what is no longer listed gets a tombstone."""
        grouped: dict[str, list[Entry]] = {}
        for namespace, entry in entries:
            grouped.setdefault(namespace, []).append(entry)
        now = self.clock()
        fresh: dict[str, _Tenant] = {}
        for namespace in set(grouped) | set(self._tenants):
            old = self._tenants.get(namespace) or _Tenant()
            tenant = _build(grouped.get(namespace, []), old.gone)
            for ident, entry in old.live.items():
                if ident not in tenant.live:
                    self._bury(tenant, entry, now)
            if tenant.live or tenant.gone:
                fresh[namespace] = tenant
        self._tenants = fresh

    def page_after(
        self,
        namespace: str,
        after: str | None,
        limit: int,
        *,
        descending: bool = True,
        group: str | None = None,
    ) -> tuple[list[dict[str, Any]], bool]:
        """The wire objects of one page of ``namespace`` (of ``group`` only, when given) after
        the entry ``after``, and has_more; :class:`CursorNotFound` for a cursor never held."""
        tenant = self._tenants.get(namespace)
        cursor = None if not after else self._cursor(tenant, after)
        ordered = tenant.lists.get(group) if tenant is not None else None
        if ordered is None:
            return [], False
        page, more = ordered.page(cursor, limit, descending)
        return [entry.data for entry in page], more

    def _cursor(self, tenant: _Tenant | None, after: str) -> SortKey:
        if tenant is not None:
            live = tenant.live.get(after)
            if live is not None:
                return live.key
            gone = tenant.gone.get(after)
            if gone is not None and self.clock() - gone[1] < self.tombstone_seconds:
                return gone[0]
        raise CursorNotFound(after)

    def _bury(self, tenant: _Tenant, entry: Entry, now: float) -> None:
        tenant.gone[entry.id] = (entry.key, now)
        tenant.gone.move_to_end(entry.id)
        gone = tenant.gone
        while gone and (
            len(gone) > self.tombstones_per_namespace
            or now - next(iter(gone.values()))[1] >= self.tombstone_seconds
        ):
            gone.popitem(last=False)


def _build(entries: list[Entry], gone: OrderedDict[str, tuple[SortKey, float]]) -> _Tenant:
    """A tenant's structures from scratch: one sort per list rather than an insert per entry."""
    tenant = _Tenant(gone=OrderedDict((k, v) for k, v in gone.items()))
    for entry in entries:
        tenant.live[entry.id] = entry  # a duplicate id (hand-made objects): the last one wins
    tenant.total = sum(entry.weight for entry in tenant.live.values())
    by_group: dict[str | None, list[Entry]] = {None: list(tenant.live.values())}
    for entry in tenant.live.values():
        if entry.group is not None:
            by_group.setdefault(entry.group, []).append(entry)
        tenant.gone.pop(entry.id, None)
    tenant.lists = {group: _Ordered(members) for group, members in by_group.items()}
    return tenant
