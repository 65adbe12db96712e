"""The retention sweep: delete what ``core.retention`` says is due, publish what it plans.

One asyncio task of the operator runs :meth:`RetentionSweeper.sweep` every
``LLMBATCH_RETENTION_INTERVAL`` seconds. Level-based and idempotent: every sweep lists BatchFiles,
Batches and BatchPools afresh (all state lives on those objects), so a restarted operator simply
carries on, and deleting a key or an object that is already gone counts as done. A file goes
bytes first, then its BatchFile: a crash in between leaves an object whose bytes are gone, which
the next sweep deletes — never bytes that no object would lead a sweep to.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from llmbatch.api.resources import PoolRetention
from llmbatch.controller import metrics
from llmbatch.controller.archive import archive_batch
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.kube import Kube
from llmbatch.core import keys
from llmbatch.core.identity import NamespaceIdentity
from llmbatch.core.retention import (
    BatchRef,
    FileDecision,
    RetentionPlan,
    StoredFile,
    plan_retention,
)
from llmbatch.storage.base import ObjectInfo, ObjectStore, delete_under

log = logging.getLogger(__name__)


@dataclass
class SweepReport:
    """What one sweep did."""

    files_deleted: int = 0
    bytes_freed: int = 0
    published: int = 0
    work_areas_removed: int = 0
    staged_removed: int = 0
    batches_archived: int = 0
    errors: int = 0

    @property
    def changed(self) -> bool:
        return bool(
            self.files_deleted
            or self.bytes_freed
            or self.published
            or self.work_areas_removed
            or self.staged_removed
            or self.batches_archived
            or self.errors
        )


class RetentionSweeper:
    """Applies the retention rules to the cluster's files and finished batches."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        config: OperatorConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.store = store
        self.config = config
        self.clock = clock
        self._objects: dict[str, Mapping[str, Any]] = {}
        """The Batch objects the last plan was made of, by uid."""
        self._unclaimed: set[str] = set()
        """Staged inline inputs the last sweep found without their Batch."""
        self.batches: Callable[[], list[dict[str, Any]] | None] | None = None
        """Every served Batch as the operator's cache holds them; None when it cannot tell
        yet (then they are listed): a sweep listing 10,000 Batches a minute moved 100 MB."""
        self.tenants: Callable[[str], NamespaceIdentity | None] | None = None
        """A namespace as the operator's watch shows it (None: not seen; then it is read)."""

    async def run(self, interval: float) -> None:
        """Sweep every ``interval`` seconds until cancelled; a failed sweep is retried next time."""
        while True:
            await asyncio.sleep(interval)
            started = time.perf_counter()
            try:
                report = await self.sweep()
            except Exception:
                metrics.RETENTION_ERRORS.inc()
                log.exception("retention sweep failed; retrying in %.0f s", interval)
            else:
                if report.changed:
                    log.info("retention sweep: %s", report)
            finally:
                metrics.RETENTION_SWEEP_SECONDS.observe(time.perf_counter() - started)

    async def plan(self) -> RetentionPlan:
        """List what retention needs and decide (no change made)."""
        now = self.clock()
        # Files before batches: a batch created after its file was listed is then seen too.
        files = [StoredFile.from_object(o) async for o in self._each("batchfiles")]
        cached = self.batches() if self.batches is not None else None
        objects = cached if cached is not None else [o async for o in self._each("batches")]
        batches = [BatchRef.from_object(o) for o in objects]
        self._objects = {ref.uid: obj for ref, obj in zip(batches, objects, strict=True)}
        pools: dict[str, PoolRetention | None] = {}
        for pool in await self.kube.list_custom("batchpools"):
            settings = (pool.get("spec") or {}).get("retention")
            try:
                pools[pool["metadata"]["name"]] = (
                    PoolRetention.model_validate(settings) if settings else None
                )
            except ValidationError:
                pools[pool["metadata"]["name"]] = None  # the CRD schema makes this unreachable
        staged = [info.key async for info in self._staged()]
        return plan_retention(files, batches, self.config.retention, pools, now, staged)

    async def _staged(self) -> AsyncIterator[ObjectInfo]:
        """The staged inline inputs of the served namespaces."""
        for namespace in self.config.namespaces or (None,):
            prefix = keys.INLINE_STAGING_PREFIX + (f"{namespace}/" if namespace else "")
            for info in await asyncio.to_thread(_listed, self.store, prefix):
                yield info

    async def sweep(self) -> SweepReport:
        """One pass: delete the due files and work areas, publish planned expiries."""
        plan = await self.plan()
        report = SweepReport()
        for decision in plan.delete:
            await self._guarded(report, self._delete_file(decision, report))
        for decision in plan.publish:
            await self._guarded(report, self._publish(decision, report))
        for batch in plan.clean_work:
            await self._guarded(report, self._remove_work_area(batch, report))
        for batch in plan.archive:
            await self._guarded(report, self._archive(batch, report))
        # Unclaimed at two sweeps in a row: the gateway stores an inline input just before it
        # creates the Batch, so one sweep can see it without its Batch.
        unclaimed = set(plan.unclaimed)
        for key in sorted(unclaimed & self._unclaimed):
            await self._guarded(report, asyncio.to_thread(self.store.delete, key))
            report.staged_removed += 1
            log.info("retention: removed the inline input %s: its Batch was never created", key)
        self._unclaimed = unclaimed - self._unclaimed
        return report

    async def _each(self, plural: str) -> AsyncIterator[dict[str, Any]]:
        for namespace in self.config.namespaces or (None,):
            async for obj in self.kube.iter_custom(plural, namespace):
                yield obj

    @staticmethod
    async def _guarded(report: SweepReport, action: Awaitable[None]) -> None:
        try:
            await action
        except Exception:
            report.errors += 1
            metrics.RETENTION_ERRORS.inc()
            log.exception("retention step failed; the next sweep retries it")

    async def _delete_file(self, decision: FileDecision, report: SweepReport) -> None:
        file = decision.file
        key: str | None = keys.file_key(file.namespace, file.name)
        if file.storage_key and file.storage_key != key:
            # Bytes are only ever stored under the key derived from the id; anything else was
            # written by hand and may be someone else's: drop the object, keep those bytes.
            log.warning(
                "BatchFile %s/%s names storage key %r, not its own; deleting only the object",
                file.namespace,
                file.name,
                file.storage_key,
            )
            key = None
        freed = await asyncio.to_thread(self._delete_key, key) if key else 0
        if freed:
            area = "input" if file.purpose == "batch" else "output"
            metrics.RETENTION_FREED_BYTES.labels(area).inc(freed)
            report.bytes_freed += freed
        if await self.kube.delete_custom("batchfiles", file.namespace, file.name, file.uid):
            metrics.RETENTION_FILES_EXPIRED.labels(file.purpose).inc()
            report.files_deleted += 1
            log.info(
                "retention: deleted %s file %s/%s (%s, expired at %d, %d bytes)",
                file.purpose,
                file.namespace,
                file.name,
                decision.rule,
                decision.expires_at,
                freed,
            )

    def _delete_key(self, key: str) -> int:
        info = self.store.head(key)
        if info is None:
            return 0  # gone already: an earlier sweep got this far
        self.store.delete(key)
        return info.size

    async def _publish(self, decision: FileDecision, report: SweepReport) -> None:
        file = decision.file
        patch = {
            "status": {"expiresAt": decision.expires_at, "usedBy": list(decision.used_by) or None}
        }
        if await self.kube.patch_custom_status("batchfiles", file.namespace, file.name, patch):
            report.published += 1

    async def _remove_work_area(self, batch: BatchRef, report: SweepReport) -> None:
        prefix = keys.work_prefix(batch.namespace, batch.uid) + "/"
        freed = await asyncio.to_thread(delete_under, self.store, prefix)
        if freed:
            metrics.RETENTION_FREED_BYTES.labels("work").inc(freed)
            report.bytes_freed += freed
        marked = await self.kube.patch_custom_status(
            "batches",
            batch.namespace,
            batch.name,
            {"status": {"workRemovedAt": int(self.clock())}},
        )
        if marked:
            report.work_areas_removed += 1

    async def _archive(self, batch: BatchRef, report: SweepReport) -> None:
        obj = self._objects.get(batch.uid)
        tenant = await self._tenant(batch.namespace)
        if obj is None or tenant is None:
            return  # its namespace is gone: the Batch goes with it, nothing to archive
        if await archive_batch(self.kube, self.store, obj, int(self.clock()), tenant.uid):
            metrics.RETENTION_BATCHES_ARCHIVED.inc()
            report.batches_archived += 1

    async def _tenant(self, namespace: str) -> NamespaceIdentity | None:
        """The namespace the batch is in, as the watch shows it (else read)."""
        known = self.tenants(namespace) if self.tenants is not None else None
        if known is not None:
            return known
        found = await self.kube.read_namespace(namespace)
        return NamespaceIdentity.of(found) if found is not None else None


def _listed(store: ObjectStore, prefix: str) -> list[ObjectInfo]:
    return list(store.list(prefix))
