"""The offboarding sweep: erase a deleted tenant's data from the store after the grace period.

``core.offboarding`` decides; this carries it out every ``LLMBATCH_RETENTION_INTERVAL``
seconds (a supervised task): the namespaces are listed, the store's notes of the namespaces it
knows (``tenants/``) are listed, new namespaces are noted, gone ones stamped, and a namespace
gone for ``LLMBATCH_RETENTION_DELETED_TENANT_SECONDS`` (7 days) has its archived records, file
bytes, staged inline inputs and work areas erased before its note is dropped.

When another namespace of the same name exists by then, only what is not the new one's is
erased: archived records of the old UID (``core.identity.record_belongs``), and file bytes and
work areas that none of the new namespace's BatchFiles and Batches refer to, once they have
been found so for :data:`UNREFERENCED_SECONDS` (bytes are written a moment before the object
that refers to them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import Kube
from llmbatch.core import archive, keys
from llmbatch.core.identity import NamespaceIdentity, record_belongs
from llmbatch.core.offboarding import Erasure, Incarnation, OffboardingPlan, plan_offboarding
from llmbatch.storage.base import ObjectInfo, ObjectNotFound, ObjectStore, delete_under

log = logging.getLogger(__name__)

UNREFERENCED_SECONDS = 300.0
"""Under a reused name, bytes no object refers to are erased only after this long so."""


@dataclass
class OffboardingReport:
    """What one pass did."""

    noted: int = 0
    gone: int = 0
    erased: int = 0
    bytes_erased: int = 0


class TenantSweeper:
    """Notes tenant namespaces in the store and erases the data of deleted ones."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.store = store
        self.served = frozenset(config.namespaces)
        self.grace_seconds = config.tenant_grace_seconds
        self.clock = clock
        self._seen: dict[tuple[str, str], NamespaceIdentity] = {}
        self._unreferenced: dict[str, float] = {}  # key -> when first found unreferenced

    def notice(self, body: Mapping[str, Any]) -> None:
        """A namespace the watch showed (no I/O): noted at the next pass even if it is gone
        by then."""
        identity = NamespaceIdentity.of(body)
        if identity is not None and self._serves(identity.name):
            self._seen[identity.name, identity.uid] = identity

    def _serves(self, namespace: str) -> bool:
        return not self.served or namespace in self.served

    async def run(self, interval: float) -> None:
        """A pass every ``interval`` seconds; a failed pass is logged and tried next time."""
        while True:
            await asyncio.sleep(interval)
            try:
                report = await self.sweep()
            except Exception:
                log.exception("offboarding sweep failed; retrying in %.0f s", interval)
            else:
                if report.gone or report.erased:
                    log.info("offboarding sweep: %s", report)

    async def plan(self, seen: list[NamespaceIdentity]) -> OffboardingPlan:
        """List the namespaces and the store's notes and decide (nothing changed)."""
        items, _ = await self.kube.list_namespaces()
        present = {
            identity.name: identity
            for identity in map(NamespaceIdentity.of, items)
            if identity is not None and self._serves(identity.name)
        }
        listed = await asyncio.to_thread(_listed, self.store, keys.TENANTS_PREFIX)
        notes = [Incarnation(*parsed) for info in listed if (parsed := _note(info))]
        noted = [n for n in notes if self._serves(n.namespace)]
        return plan_offboarding(noted, present, seen, int(self.clock()), self.grace_seconds)

    async def sweep(self) -> OffboardingReport:
        """One pass: note, stamp, erase."""
        seen = list(self._seen.values())
        plan = await self.plan(seen)
        report = OffboardingReport()
        for note in plan.register:
            await self._put_note(note)
            report.noted += 1
        for identity in seen:  # noted now (or before): a failed pass keeps them for the next
            self._seen.pop((identity.name, identity.uid), None)
        for note in plan.stamp:
            await self._put_note(note)
            await asyncio.to_thread(self.store.delete, keys.tenant_key(note.namespace, note.uid))
            report.gone += 1
            log.info("tenant %s (uid %s) is gone; its data goes in %d s",
                     note.namespace, note.uid, self.grace_seconds)  # fmt: skip
        for erasure in plan.erase:
            freed = await self._erase(erasure)
            if freed is not None:
                report.erased += 1
                report.bytes_erased += freed
        metrics.TENANTS_AWAITING_SWEEP.set(plan.waiting)
        return report

    async def _put_note(self, note: Incarnation) -> None:
        key = keys.tenant_key(note.namespace, note.uid, note.gone_at)
        await asyncio.to_thread(self.store.put, key, b"")

    async def _erase(self, erasure: Erasure) -> int | None:
        """Erase a gone tenant's data and drop its notes; the bytes erased, or None when some
        wait for a later pass (a reused name)."""
        gone = erasure.gone
        if erasure.successor is None:
            freed = 0
            for area in keys.TENANT_AREAS:
                prefix = keys.tenant_area(area, gone.namespace)
                erased = await asyncio.to_thread(delete_under, self.store, prefix)
                metrics.TENANT_SWEPT_BYTES.labels(area).inc(erased)
                freed += erased
        else:
            freed = await self._erase_records(gone, erasure.successor)
            left, erased = await self._erase_unreferenced(gone.namespace)
            freed += erased
            if left:
                return None
        for note in (keys.tenant_key(gone.namespace, gone.uid), self._gone_note(gone)):
            await asyncio.to_thread(self.store.delete, note)
        metrics.TENANT_SWEEPS.inc()
        log.info("tenant %s (uid %s): erased %d bytes from the store",
                 gone.namespace, gone.uid, freed)  # fmt: skip
        return freed

    @staticmethod
    def _gone_note(gone: Incarnation) -> str:
        return keys.tenant_key(gone.namespace, gone.uid, gone.gone_at)

    async def _erase_records(self, gone: Incarnation, successor: NamespaceIdentity) -> int:
        """The archived records under the reused name that are not the successor's."""
        prefix = keys.tenant_area("archive", gone.namespace)
        freed = 0
        for info in await asyncio.to_thread(_listed, self.store, prefix):
            try:
                record = archive.decode(await asyncio.to_thread(self.store.get, info.key))
            except (ObjectNotFound, archive.NotARecord):
                continue
            if not record_belongs(successor, record):
                await asyncio.to_thread(self.store.delete, info.key)
                freed += info.size
        metrics.TENANT_SWEPT_BYTES.labels("archive").inc(freed)
        return freed

    async def _erase_unreferenced(self, namespace: str) -> tuple[int, int]:
        """File bytes and work areas under a reused name that none of the namespace's
        BatchFiles and Batches refer to, once found so for :data:`UNREFERENCED_SECONDS`:
        ``(keys left for a later pass, bytes erased)``."""
        files = await self.kube.list_custom("batchfiles", namespace)
        batches = await self.kube.list_custom("batches", namespace)
        owners = {
            "files": {f["metadata"]["name"] for f in files},
            "work": {b["metadata"]["uid"] for b in batches},
        }
        now = self.clock()
        left = freed = 0
        for area, referenced in owners.items():
            prefix = keys.tenant_area(area, namespace)
            for info in await asyncio.to_thread(_listed, self.store, prefix):
                if info.key.removeprefix(prefix).split("/")[0] in referenced:
                    self._unreferenced.pop(info.key, None)
                elif now - self._unreferenced.setdefault(info.key, now) < UNREFERENCED_SECONDS:
                    left += 1
                else:
                    await asyncio.to_thread(self.store.delete, info.key)
                    self._unreferenced.pop(info.key, None)
                    metrics.TENANT_SWEPT_BYTES.labels(area).inc(info.size)
                    freed += info.size
        return left, freed


def _note(info: ObjectInfo) -> tuple[str, str, int | None] | None:
    return keys.parse_tenant_key(info.key)


def _listed(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    return list(store.list(prefix))
