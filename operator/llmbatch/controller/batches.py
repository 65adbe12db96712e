"""The Batch reconciler: one idempotent step per call, all state on the object.

``BatchReconciler.step`` reads the Batch, its Jobs and the store, takes the next step of the
lifecycle and returns the status patch plus the Events to post. A kopf timer calls it every few
seconds (level-based), and create/cancel handlers call it at once (edge-triggered speed-up), so a
restarted operator simply continues: nothing is kept in memory but throttling timestamps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import yaml

from llmbatch.api.resources import (
    API_VERSION,
    CREDIT_ACCOUNT_NAME,
    BatchPoolSpec,
    BatchSpec,
    CreditReservation,
    Pricing,
    ShardStatus,
)
from llmbatch.api.shard import EngineSpec, ModelRef, ShardSpec
from llmbatch.controller import metrics
from llmbatch.controller.config import OperatorConfig
from llmbatch.controller.credits import CreditLedger
from llmbatch.controller.finalize import ShardOutcome, merge_shard_outputs
from llmbatch.controller.jobs import ANNOTATION_PREEMPTIONS, LABEL_BATCH_UID, build_shard_job
from llmbatch.controller.kube import Kube
from llmbatch.core import billing, keys
from llmbatch.core.admission import check_pool_queue, max_requests
from llmbatch.core.ids import batch_id_from_name, shard_job_name
from llmbatch.core.lifecycle import (
    TERMINAL,
    cost_of,
    set_condition,
    unix_seconds,
    window_seconds,
)
from llmbatch.core.retention import output_expires_at
from llmbatch.core.validation import (
    ErrorCode,
    InvalidLine,
    ValidationLimits,
    ValidationResult,
    iter_lines,
    validate_stream,
)
from llmbatch.storage.base import IntegrityError, ObjectInfo, ObjectNotFound, ObjectStore
from llmbatch.storage.shardresults import read_progress

log = logging.getLogger(__name__)

NAMESPACE_EXPEDITED_DISABLED = "llmbatch.io/expedited-disabled"
FLEX_WINDOW = "72h"
STALE_BODY_SECONDS = 30.0
#: Re-runs of a shard whose Job succeeded without a result for every request (then: Failed).
MAX_RERUNS = 2


@dataclass
class Step:
    """What one reconcile step decided."""

    status: dict[str, Any] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) — type is Normal or Warning."""

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(("Warning" if warning else "Normal", reason, message))


class Rejected(Exception):
    """Validation failed: the batch becomes ``failed`` with these errors."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(errors[0]["message"] if errors else "rejected")
        self.errors = errors


def _error(code: str, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": None}


def tier_of(spec: BatchSpec) -> str:
    """expedited / standard / flex (flex is asked for through ``metadata.tier``)."""
    if (spec.metadata or {}).get("tier") == "flex" or spec.priority == "flex":
        return "flex"
    return spec.priority


def _created(meta: dict[str, Any]) -> int:
    stamp = meta.get("creationTimestamp")
    return unix_seconds(stamp) if stamp else int(time.time())


def engine_args(pool: BatchPoolSpec) -> dict[str, Any]:
    """``--max-num-seqs=64`` style pool arguments as the executor's ``{max_num_seqs: 64}``."""
    args: dict[str, Any] = {}
    for item in pool.executor.engine_args or []:
        name, _, value = item.lstrip("-").partition("=")
        args[name.replace("-", "_")] = yaml.safe_load(value) if value else True
    return args


def _job_finished(job: dict[str, Any]) -> tuple[str | None, str]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Succeeded", ""
        if cond.get("type") == "Failed":
            return "Failed", cond.get("message") or cond.get("reason") or "Job failed"
    return None, ""


class BatchReconciler:
    """Drives Batches through validating → in_progress → finalizing → terminal."""

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
        self.credits = CreditLedger(kube, config.namespaces, clock)
        self._last_progress: dict[str, float] = {}
        # uid -> (phase we patched, when): a trigger that still sees the old phase holds a stale
        # body (kopf applies patches after the handler returns) and must not act on it.
        self._patched_phase: dict[str, tuple[str, float]] = {}

    # --- entry point ---------------------------------------------------------------------------

    async def step(self, body: dict[str, Any]) -> Step:
        meta = body["metadata"]
        status = body.get("status") or {}
        spec = BatchSpec.model_validate(body.get("spec") or {})
        phase = status.get("status")
        now = self.clock()
        result = Step()
        expected = self._patched_phase.get(meta["uid"])
        if expected is not None:
            if expected[0] != phase and now - expected[1] < STALE_BODY_SECONDS:
                return result
            del self._patched_phase[meta["uid"]]
        await self._dispatch(meta, spec, status, phase, result, now)
        if result.status.get("status") in TERMINAL:
            await self._settle(meta, status, result, now)
        if "status" in result.status:
            self._patched_phase[meta["uid"]] = (result.status["status"], now)
        return result

    async def _dispatch(
        self,
        meta: dict[str, Any],
        spec: BatchSpec,
        status: dict[str, Any],
        phase: str | None,
        result: Step,
        now: float,
    ) -> None:
        if phase is None:
            self._initialise(meta, spec, result, now)
        elif phase in TERMINAL:
            pass  # Jobs were removed when the batch finished; the timer skips terminal batches
        elif phase == "validating":
            if spec.cancel:
                self._finish_without_running(status, result, now, "cancelled")
            elif now >= status.get("expiresAt", now + 1):
                self._finish_without_running(status, result, now, "expired")
            else:
                await self._validate(meta, spec, status, result, now)
        elif phase == "in_progress":
            if spec.cancel:
                self._transition(
                    result,
                    status,
                    "cancelling",
                    now,
                    "CancelRequested",
                    "Cancel requested: stopping shard Jobs, keeping finished results",
                )
            elif now >= status.get("expiresAt", now + 1):
                self._transition(
                    result,
                    status,
                    "finalizing",
                    now,
                    "Expired",
                    "Completion window passed: stopping shard Jobs",
                )
                result.status["conditions"] = set_condition(
                    status.get("conditions"),
                    "Expired",
                    True,
                    "WindowPassed",
                    "The completion window passed before every request ran.",
                    now,
                )
            else:
                await self._run(meta, spec, status, result, now)
        elif phase in ("cancelling", "finalizing"):
            await self._finalize(meta, spec, status, result, now)

    # --- small helpers -------------------------------------------------------------------------

    @staticmethod
    def _transition(
        result: Step, status: dict[str, Any], phase: str, now: float, reason: str, message: str
    ) -> None:
        result.status["status"] = phase
        result.status[f"{_camel(phase)}At"] = int(now)
        result.status["conditions"] = set_condition(
            result.status.get("conditions", status.get("conditions")),
            "Ready",
            phase in TERMINAL,
            reason,
            message,
            now,
        )
        result.event(reason, message, warning=phase in ("failed", "expired"))
        metrics.BATCH_TRANSITIONS.labels(phase).inc()
        log.info("batch → %s (%s): %s", phase, reason, message)

    def _initialise(self, meta: dict[str, Any], spec: BatchSpec, result: Step, now: float) -> None:
        created = _created(meta)
        window = spec.completion_window
        if tier_of(spec) == "flex" and window == "24h":
            window = FLEX_WINDOW
        result.status.update(
            status="validating",
            createdAt=created,
            expiresAt=created + window_seconds(window),
            requestCounts={"total": 0, "completed": 0, "failed": 0},
            observedGeneration=meta.get("generation"),
        )
        if spec.model:
            result.status["model"] = spec.model
        result.status["conditions"] = set_condition(
            None, "Ready", False, "Validating", "Validating the input", now
        )
        result.event("Accepted", f"Batch {batch_id_from_name(meta['name'])} accepted; validating")
        metrics.BATCH_TRANSITIONS.labels("validating").inc()

    def _finish_without_running(
        self, status: dict[str, Any], result: Step, now: float, phase: str
    ) -> None:
        if phase == "cancelled":
            result.status["cancellingAt"] = int(now)
        counts = status.get("requestCounts") or {}
        total = counts.get("total", 0)
        result.status["requestCounts"] = {"total": total, "completed": 0, "failed": total}
        self._transition(
            result, status, phase, now, phase.capitalize(), f"Batch {phase} before any request ran"
        )

    # --- validating ----------------------------------------------------------------------------

    async def _validate(
        self,
        meta: dict[str, Any],
        spec: BatchSpec,
        status: dict[str, Any],
        result: Step,
        now: float,
    ) -> None:
        namespace, uid = meta["namespace"], meta["uid"]
        started = time.perf_counter()
        try:
            input_key = await self._input_key(namespace, uid, spec)
            model = await asyncio.to_thread(self._peek_model, input_key, spec.endpoint)
            if model is None:
                # No line names a model: report every problem the default limits find.
                verdict = await asyncio.to_thread(
                    self._run_validator, input_key, spec.endpoint, ValidationLimits(), 1000
                )
                if not verdict.ok:
                    raise Rejected([e.as_dict() for e in verdict.errors])
            pool_name, pool, pool_status = await self._choose_pool(spec, model)
            await self._check_tier(namespace, spec, pool_name, pool)
            limits = ValidationLimits(
                max_requests=max_requests(pool),
                max_bytes=pool.limits.max_bytes,
                max_line_bytes=pool.limits.max_line_bytes,
                require_output_token_limit=pool.limits.require_output_token_limit,
            )
            verdict = await asyncio.to_thread(
                self._run_validator, input_key, spec.endpoint, limits, pool.shard_requests
            )
        except Rejected as rejected:
            self._fail(result, status, rejected.errors, now)
            return
        finally:
            metrics.VALIDATION_SECONDS.observe(time.perf_counter() - started)
        if not verdict.ok:
            errors = [e.as_dict() for e in verdict.errors]
            self._fail(result, status, errors, now, total=verdict.request_count)
            return
        # Fail fast rather than queue without bound (the gateway answers 429 up front).
        refusal = check_pool_queue(pool_name, pool, pool_status, verdict.request_count)
        if refusal is not None:
            self._fail(
                result,
                status,
                [_error(refusal.code, refusal.message)],
                now,
                total=verdict.request_count,
            )
            return
        if spec.requests is None:
            try:
                input_key = await self._pin_input(meta, input_key, verdict.total_bytes)
            except Rejected as rejected:
                self._fail(result, status, rejected.errors, now, total=verdict.request_count)
                return
        tier = tier_of(spec)
        try:
            pricing, charges = await self._reserve(
                meta, pool_name, pool, pool_status, tier, verdict
            )
        except (billing.InsufficientCredit, billing.TooManyReservations) as exc:
            code = "insufficient_credit"
            if isinstance(exc, billing.TooManyReservations):
                code = "too_many_batches"
            self._fail(result, status, [_error(code, str(exc))], now, total=verdict.request_count)
            return
        result.status.update(
            billing=charges,
            model=verdict.model,
            pool=pool_name,
            workerNamespace=pool.worker_namespace,
            gpusPerSlot=pool.gpus_per_slot,
            inputKey=input_key,
            inputBytes=verdict.total_bytes,
            requestCounts={"total": verdict.request_count, "completed": 0, "failed": 0},
            pricing=pricing,
            shards=[
                ShardStatus(
                    index=s.index,
                    start=s.start,
                    end=s.end,
                    first_line=s.first_line,
                    line_count=s.line_count,
                    request_count=s.request_count,
                ).to_k8s()
                for s in verdict.shards
            ],
        )
        self._transition(
            result,
            status,
            "in_progress",
            now,
            "Validated",
            f"{verdict.request_count} requests for {verdict.model} in {len(verdict.shards)} "
            f"shards on pool {pool_name}",
        )

    async def _reserve(
        self,
        meta: dict[str, Any],
        pool_name: str,
        pool: BatchPoolSpec,
        pool_status: dict[str, Any],
        tier: str,
        verdict: ValidationResult,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Credit at acceptance: ``(status.pricing, status.billing)``.

        The gateway reserved at creation (its prices are fixed on the batch) unless the Batch
        came from kubectl or the model had no pool then; the operator reserves the estimate now
        in that case. The gateway estimated from the sizes on the BatchFile, which whoever may
        write BatchFiles can change: a reservation short of the estimate of the validated input
        is topped up now (``billing.InsufficientCredit`` when that does not fit). A tenant
        without a CreditAccount is not limited.
        """
        tier_pricing = getattr(pool.tiers, tier).pricing
        size = billing.BatchSize(
            input_bytes=verdict.total_bytes,
            requests=verdict.request_count,
            output_token_limits=verdict.declared_output_tokens,
            requests_without_output_limit=verdict.requests_without_output_limit,
        )
        throughput = pool_status.get("throughputPerSlot")
        estimate = billing.estimate_batch(pool, tier_pricing, size, throughput)
        gpu_mode = pool.billing.mode == "GPUTime"
        entry = CreditReservation(
            batch=meta["name"],
            amount=billing.money(estimate.amount),
            estimated_tokens=estimate.tokens,
            pool=pool_name,
            mode=pool.billing.mode,
            pricing=None if gpu_mode else tier_pricing,
            gpu_hour_price=pool.billing.gpu_hour_price if gpu_mode else None,
            created_at=int(self.clock()),
        )
        hold = await self.credits.reserve(meta["namespace"], entry)
        if hold is not None and not hold.added:
            wanted = billing.accepted_reservation(hold.entry, entry, pool, size, throughput)
            if wanted != hold.entry:
                hold = await self.credits.top_up(meta["namespace"], wanted) or hold
        held = hold.entry if hold is not None else None
        fixed = held or entry
        if fixed.mode == "GPUTime":
            pricing = Pricing(currency=tier_pricing.currency)  # no separate token charge
        else:
            pricing = fixed.pricing or tier_pricing
        charges: dict[str, Any] = {
            "mode": fixed.mode,
            "estimatedTokens": fixed.estimated_tokens,
            "reserved": fixed.amount if held is not None else "0",
        }
        if fixed.gpu_hour_price is not None:
            charges["gpuHourPrice"] = fixed.gpu_hour_price
        if held is not None:
            charges["account"] = CREDIT_ACCOUNT_NAME
        if hold is not None and hold.added:
            # only what this call reserved: the gateway counts its own, a rerun adds nothing
            metrics.CREDITS_RESERVED.labels(self.credits.tenant_label(meta["namespace"])).inc(
                float(hold.added)
            )
        return pricing.to_k8s(), charges

    async def _settle(
        self, meta: dict[str, Any], status: dict[str, Any], result: Step, now: float
    ) -> None:
        """At a terminal state: release the reservation and charge the cost, exactly once.

        The account write removes the reservation together with adding the charge, so a second
        run (the status patch was lost, the operator restarted) finds no reservation and
        charges nothing; ``billing.settledAt`` records it on the batch.
        """
        charges = {**(status.get("billing") or {}), **(result.status.get("billing") or {})}
        if charges.get("settledAt"):
            return
        cost = str(result.status.get("cost") or status.get("cost") or "0")
        await self.credits.settle(meta["namespace"], meta["name"], cost)
        charges["settledAt"] = int(now)
        result.status["billing"] = charges

    @staticmethod
    def _without_nulls(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # The API server drops null fields; sending them makes every patch look like a change.
        return [{k: v for k, v in e.items() if v is not None} for e in errors]

    def _fail(
        self,
        result: Step,
        status: dict[str, Any],
        errors: list[dict[str, Any]],
        now: float,
        total: int = 0,
    ) -> None:
        result.status["errors"] = self._without_nulls(errors[:100])
        result.status["requestCounts"] = {"total": total, "completed": 0, "failed": total}
        first = errors[0] if errors else {"message": "invalid input"}
        where = f" (line {first['line']})" if first.get("line") else ""
        self._transition(
            result,
            status,
            "failed",
            now,
            "ValidationFailed",
            f"{len(errors)} validation error(s); first: {first['message']}{where}",
        )

    async def _input_key(self, namespace: str, uid: str, spec: BatchSpec) -> str:
        if spec.requests is not None:
            key = keys.inline_input_key(namespace, uid)
            data = b"".join(
                orjson.dumps(
                    {"custom_id": r.custom_id, "method": r.method, "url": r.url, "body": r.body}
                )
                + b"\n"
                for r in spec.requests
            )
            await asyncio.to_thread(self.store.put, key, data)
            return key
        file_id = spec.input_file_id or ""
        batch_file = await self.kube.get_custom("batchfiles", namespace, file_id)
        if batch_file is None:
            raise Rejected([_error("invalid_file", f"No such file: {file_id}", "input_file_id")])
        file_spec = batch_file.get("spec") or {}
        if file_spec.get("purpose") != "batch":
            raise Rejected(
                [
                    _error(
                        "invalid_file_purpose",
                        f"File {file_id} has purpose {file_spec.get('purpose')!r}, not 'batch'.",
                        "input_file_id",
                    )
                ]
            )
        storage_key = keys.owned_file_key(namespace, file_id, file_spec.get("storageKey"))
        if storage_key is None:
            raise Rejected(
                [
                    _error(
                        "invalid_file",
                        f"File {file_id} names storage outside its own file; refusing to read it.",
                        "input_file_id",
                    )
                ]
            )
        if await asyncio.to_thread(self.store.head, storage_key) is None:
            raise Rejected(
                [_error("invalid_file", f"The bytes of {file_id} are gone.", "input_file_id")]
            )
        return storage_key

    async def _pin_input(self, meta: dict[str, Any], key: str, size: int) -> str:
        """Copy the validated input into the batch's work area; the shards and finalisation read
        the copy, so a user may delete the file (OpenAI allows it) while the batch runs: it leaves
        the API at once, and the bytes the batch needs stay until its work area is removed.
        Server-side on S3 (UploadPartCopy); the size validated is checked on the copy."""
        pinned = keys.inline_input_key(meta["namespace"], meta["uid"])
        source = ObjectInfo(key=key, size=size)
        try:
            await asyncio.to_thread(self.store.compose, pinned, [source])
        except (ObjectNotFound, IntegrityError) as exc:
            raise Rejected(
                [_error("invalid_file", f"The input file changed or is gone: {exc}")]
            ) from exc
        return pinned

    def _peek_model(self, key: str, endpoint: str) -> str | None:
        """The model of the first readable line (chooses the pool whose limits then apply)."""
        for _, raw in iter_lines(self.store.iter_range(key)):
            try:
                line = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            body = line.get("body") if isinstance(line, dict) else None
            model = body.get("model") if isinstance(body, dict) else None
            if isinstance(model, str) and model:
                return model
        return None

    def _run_validator(
        self, key: str, endpoint: str, limits: ValidationLimits, shard_requests: int
    ) -> ValidationResult:
        try:
            return validate_stream(
                self.store.iter_range(key),
                endpoint=endpoint,
                limits=limits,
                shard_requests=shard_requests,
            )
        except ObjectNotFound as exc:
            raise Rejected([_error("invalid_file", "The input file is gone.")]) from exc

    async def _choose_pool(
        self, spec: BatchSpec, model: str | None
    ) -> tuple[str, BatchPoolSpec, dict[str, Any]]:
        if model is None:
            raise Rejected(
                [
                    InvalidLine(
                        ErrorCode.MISSING_MODEL,
                        "No line of the input names a model.",
                        None,
                        "body.model",
                    ).as_dict()
                ]
            )
        pools = await self.kube.list_custom("batchpools")
        served: list[str] = []
        for pool in pools:
            pool_spec = BatchPoolSpec.model_validate(pool.get("spec") or {})
            names = [m.name for m in pool_spec.models]
            served += names
            if spec.pool and pool["metadata"]["name"] != spec.pool:
                continue
            if model in names:
                return pool["metadata"]["name"], pool_spec, pool.get("status") or {}
        where = f"pool {spec.pool!r}" if spec.pool else "any pool"
        listing = ", ".join(sorted(set(served))) or "none"
        # a line may name any model: cut it so the message fits status.errors (4096 characters)
        shown = model if len(model) <= 256 else model[:256] + "…"
        raise Rejected(
            [
                _error(
                    "model_not_found",
                    f"Model {shown!r} is not served by {where}. Served models: {listing}.",
                    "body.model",
                )
            ]
        )

    async def _check_tier(
        self, namespace: str, spec: BatchSpec, pool_name: str, pool: BatchPoolSpec
    ) -> None:
        if spec.priority != "expedited":
            return
        annotations = await self.kube.namespace_annotations(namespace)
        if annotations.get(NAMESPACE_EXPEDITED_DISABLED, "").lower() == "true":
            raise Rejected(
                [
                    _error(
                        "expedited_not_allowed",
                        "Expedited priority is disabled for this organization.",
                        "priority",
                    )
                ]
            )
        if not pool.expedited_allowed:
            raise Rejected(
                [
                    _error(
                        "expedited_not_allowed",
                        f"Pool {pool_name} does not accept expedited batches.",
                        "priority",
                    )
                ]
            )

    # --- in_progress ---------------------------------------------------------------------------

    async def _pool_or_none(self, name: str | None) -> BatchPoolSpec | None:
        pool = await self.kube.get_custom("batchpools", None, name) if name else None
        return None if pool is None else BatchPoolSpec.model_validate(pool.get("spec") or {})

    def _pool_gone(self, status: dict[str, Any], result: Step, now: float, pool: str) -> None:
        """The pool was deleted under a running batch: stop, keep what finished, end failed."""
        message = f"Pool {pool} was deleted while the batch ran; its requests that had not run fail"
        self._transition(result, status, "finalizing", now, "PoolDeleted", message)
        result.status["conditions"] = set_condition(
            result.status["conditions"], "PoolDeleted", True, "PoolDeleted", message, now
        )
        result.events[-1] = ("Warning", "PoolDeleted", message)

    async def _check_covered(
        self, meta: dict[str, Any], shard: dict[str, Any], result: Step, worker_namespace: str
    ) -> None:
        """A shard whose Job succeeded must have a result for every request of its range.

        A run that exits 0 without them breaks the executor's contract (a lost commit): rather
        than turn those requests into ``shard_failed`` lines, re-run the shard (resuming from
        its chunks) in a Job of its own, at most :data:`MAX_RERUNS` times.
        """
        prefix = keys.shard_prefix(meta["namespace"], meta["uid"], shard["index"])
        progress = await asyncio.to_thread(read_progress, self.store, prefix)
        covered = 0 if progress is None else progress.completed + progress.failed
        missing = shard["requestCount"] - covered
        if progress is not None and progress.done and missing <= 0:
            return
        metrics.SHARD_INCOMPLETE.inc()
        reruns = int(shard.get("reruns") or 0)
        message = (
            f"Shard {shard['index']} succeeded with {max(missing, 0)} of its "
            f"{shard['requestCount']} requests without a result (done="
            f"{progress is not None and progress.done})"
        )
        if reruns >= MAX_RERUNS:
            shard["phase"] = "Failed"
            shard["message"] = f"{message}; gave up after {reruns} re-runs"
            result.event("ShardIncomplete", shard["message"], warning=True)
            return
        await self.kube.delete_job(worker_namespace, shard.pop("job"))
        shard["reruns"] = reruns + 1
        shard["phase"] = "Pending"
        result.event("ShardIncomplete", f"{message}; re-running it", warning=True)

    async def _run(
        self,
        meta: dict[str, Any],
        spec: BatchSpec,
        status: dict[str, Any],
        result: Step,
        now: float,
    ) -> None:
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        pool_name = status["pool"]
        pool = await self._pool_or_none(pool_name)
        if pool is None:
            self._pool_gone(status, result, now, pool_name)
            return
        # Normalised like the API server stores them (defaults filled), so comparisons hold.
        shards = [ShardStatus.model_validate(s).to_k8s() for s in status.get("shards") or []]
        jobs = {
            job["metadata"]["name"]: job
            for job in await self.kube.list_jobs(pool.worker_namespace, f"{LABEL_BATCH_UID}={uid}")
        }
        created = status.get("createdAt") or _created(meta)
        for shard in shards:
            index = shard["index"]
            job = jobs.get(shard_job_name(uid, index, shard.get("reruns", 0)))
            if job is None and shard["phase"] not in ("Succeeded", "Failed"):
                spec_key = keys.shard_spec_key(namespace, uid, index)
                shard_spec = self._shard_spec(meta, spec, status, pool, shard)
                await asyncio.to_thread(
                    self.store.put, spec_key, shard_spec.model_dump_json().encode()
                )
                job = await self.kube.create_or_adopt_job(
                    build_shard_job(
                        config=self.config,
                        pool_name=pool_name,
                        pool=pool,
                        batch_namespace=namespace,
                        batch_name=name,
                        batch_uid=uid,
                        tier=tier_of(spec),
                        created_at=created,
                        shard_index=index,
                        shard_requests=shard["requestCount"],
                        spec_key=spec_key,
                        rerun=shard.get("reruns", 0),
                    )
                )
                shard["job"] = job["metadata"]["name"]
            if job is not None:
                before = shard["phase"]
                self._observe_job(shard, job, pool_name, now)
                if shard["phase"] == "Succeeded" and before != "Succeeded":
                    await self._check_covered(meta, shard, result, pool.worker_namespace)
                if shard["phase"] == "Failed" and before != "Failed":
                    result.event(
                        "ShardFailed",
                        f"Shard {index} failed; its unfinished requests become shard_failed "
                        f"error lines: {shard.get('message') or 'the shard did not finish'}"[:1024],
                        warning=True,
                    )
        if shards != status.get("shards"):
            result.status["shards"] = shards
        if all(s["phase"] in ("Succeeded", "Failed") for s in shards):
            await self._fold_progress(meta, status, shards, result, now, force=True)
            self._transition(
                result,
                status,
                "finalizing",
                now,
                "ShardsFinished",
                "Every shard finished; merging results",
            )
            return
        await self._fold_progress(meta, status, shards, result, now)

    def _shard_spec(
        self,
        meta: dict[str, Any],
        spec: BatchSpec,
        status: dict[str, Any],
        pool: BatchPoolSpec,
        shard: dict[str, Any],
    ) -> ShardSpec:
        model = next(m for m in pool.models if m.name == status["model"])
        return ShardSpec(
            batch_id=batch_id_from_name(meta["name"]),
            batch_uid=meta["uid"],
            shard_index=shard["index"],
            endpoint=spec.endpoint,
            store=self.config.executor_store_uri,
            input_key=status["inputKey"],
            start=shard["start"],
            end=shard["end"],
            first_line=shard["firstLine"],
            output_prefix=keys.shard_prefix(meta["namespace"], meta["uid"], shard["index"]),
            model=ModelRef(name=model.name, path=model.source),
            engine=EngineSpec(name=pool.executor.engine, args=engine_args(pool)),
            flush_lines=pool.executor.flush_lines,
            flush_seconds=pool.executor.flush_seconds,
            drain_seconds=max(1, pool.executor.termination_grace_seconds - 5),
        )

    @staticmethod
    def _observe_job(
        shard: dict[str, Any], job: dict[str, Any], pool_name: str, now: float
    ) -> None:
        shard["job"] = job["metadata"]["name"]
        finished, message = _job_finished(job)
        started = _stamp((job.get("status") or {}).get("startTime"))
        if finished is not None:
            if shard["phase"] != finished:
                job_status = job.get("status") or {}
                start, end = job_status.get("startTime"), job_status.get("completionTime")
                if start and end:
                    seconds = unix_seconds(end) - unix_seconds(start)
                    metrics.SHARD_RUN_SECONDS.labels(pool_name).observe(seconds)
                _track_run(shard, started, _finished_at(job) or int(now), False, now)
            shard["phase"] = finished
            if message:
                shard["message"] = message[:4096]
            return
        annotations = job["metadata"].get("annotations") or {}
        shard["preemptions"] = int(annotations.get(ANNOTATION_PREEMPTIONS, "0"))
        suspended = (job.get("spec") or {}).get("suspend")
        active = (job.get("status") or {}).get("active") or 0
        shard["phase"] = "Pending" if suspended else ("Running" if active else "Admitted")
        _track_run(shard, started, None, not suspended, now)

    async def _fold_progress(
        self,
        meta: dict[str, Any],
        status: dict[str, Any],
        shards: list[dict[str, Any]],
        result: Step,
        now: float,
        *,
        force: bool = False,
    ) -> None:
        uid = meta["uid"]
        if not force and now - self._last_progress.get(uid, 0.0) < self.config.progress_interval:
            return
        self._last_progress[uid] = now
        completed = failed = input_tokens = output_tokens = total_tokens = 0
        for shard in shards:
            prefix = keys.shard_prefix(meta["namespace"], uid, shard["index"])
            progress = await asyncio.to_thread(read_progress, self.store, prefix)
            if progress is None:
                continue
            shard["completed"], shard["failed"] = progress.completed, progress.failed
            completed += progress.completed
            failed += progress.failed
            input_tokens += progress.input_tokens
            output_tokens += progress.output_tokens
            total_tokens += progress.total_tokens
        counts = {
            "total": (status.get("requestCounts") or {}).get("total", 0),
            "completed": completed,
            "failed": failed,
        }
        usage = {
            "inputTokens": input_tokens,
            "outputTokens": output_tokens,
            "totalTokens": total_tokens,
        }
        if counts != status.get("requestCounts"):
            result.status["requestCounts"] = counts
        if any(usage[k] != (status.get("usage") or {}).get(k) for k in usage):
            result.status["usage"] = usage
        if shards != status.get("shards"):
            result.status["shards"] = shards

    # --- stopping and finalizing ---------------------------------------------------------------

    async def _stop_jobs(self, meta: dict[str, Any], worker_namespace: str) -> bool:
        """Delete the batch's Jobs; True once no shard process can still write."""
        selector = f"{LABEL_BATCH_UID}={meta['uid']}"
        stopped = False
        for job in await self.kube.list_jobs(worker_namespace, selector):
            if _job_finished(job)[0] is None:
                await self.kube.delete_job(worker_namespace, job["metadata"]["name"])
                stopped = True
        if stopped:
            # Do not wait for the garbage collector: SIGTERM the shard processes now.
            await self.kube.delete_pods(worker_namespace, selector)
        pods = await self.kube.list_pods(worker_namespace, selector)
        return all((p.get("status") or {}).get("phase") in ("Succeeded", "Failed") for p in pods)

    async def _worker_namespace(self, status: dict[str, Any]) -> str | None:
        """Where the batch's Jobs run: recorded at acceptance; the pool's for older batches."""
        if status.get("workerNamespace"):
            return str(status["workerNamespace"])
        pool = await self._pool_or_none(status.get("pool"))
        return None if pool is None else pool.worker_namespace

    async def _cleanup_jobs(self, meta: dict[str, Any], status: dict[str, Any]) -> None:
        worker_namespace = await self._worker_namespace(status)
        if worker_namespace is None:
            return
        for job in await self.kube.list_jobs(worker_namespace, f"{LABEL_BATCH_UID}={meta['uid']}"):
            await self.kube.delete_job(worker_namespace, job["metadata"]["name"])

    async def _finalize(
        self,
        meta: dict[str, Any],
        spec: BatchSpec,
        status: dict[str, Any],
        result: Step,
        now: float,
    ) -> None:
        namespace, uid = meta["namespace"], meta["uid"]
        pool = await self._pool_or_none(status.get("pool"))
        worker_namespace = await self._worker_namespace(status)
        if worker_namespace is not None and not await self._stop_jobs(meta, worker_namespace):
            return  # shard processes still flushing; next round
        expired = _condition(status, "Expired")
        pool_deleted = _condition(status, "PoolDeleted")
        cancelled = status.get("status") == "cancelling"
        never_run = "batch_cancelled" if cancelled else "batch_expired" if expired else None
        outcomes = []
        for shard in status.get("shards") or []:
            code, reason = never_run or "shard_failed", ""
            if never_run is None and pool_deleted:
                code = "pool_deleted"
                reason = f"pool {status.get('pool')} was deleted before this request ran"
            elif never_run is None:
                reason = shard.get("message") or "the shard did not finish"
            outcomes.append(
                ShardOutcome(
                    index=shard["index"],
                    prefix=keys.shard_prefix(namespace, uid, shard["index"]),
                    start=shard["start"],
                    end=shard["end"],
                    first_line=shard["firstLine"],
                    never_run_code=code,
                    reason=reason,
                )
            )
        output_id = keys.derived_file_id(uid, "output")
        error_id = keys.derived_file_id(uid, "errors")
        started = time.perf_counter()
        merged = await asyncio.to_thread(
            merge_shard_outputs,
            self.store,
            namespace=namespace,
            batch_uid=uid,
            input_key=status["inputKey"],
            shards=outcomes,
            output_key=keys.file_key(namespace, output_id),
            error_key=keys.file_key(namespace, error_id),
        )
        metrics.FINALIZE_SECONDS.observe(time.perf_counter() - started)
        expires_at = output_expires_at(
            int(now),
            spec.output_expires_after_seconds,
            pool.retention if pool is not None else None,
            self.config.retention,
        )
        batch_id = batch_id_from_name(meta["name"])
        for file_id, key, size, lines, suffix in (
            (output_id, merged.output_key, merged.output_bytes, merged.completed, "output"),
            (error_id, merged.error_key, merged.error_bytes, merged.failed, "errors"),
        ):
            if key is None:
                continue
            await self.kube.create_or_adopt_custom(
                "batchfiles",
                namespace,
                {
                    "apiVersion": API_VERSION,
                    "kind": "BatchFile",
                    "metadata": {
                        "name": file_id,
                        "namespace": namespace,
                        "labels": {LABEL_BATCH_UID: uid},
                        "ownerReferences": [
                            {
                                "apiVersion": API_VERSION,
                                "kind": "Batch",
                                "name": meta["name"],
                                "uid": uid,
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": {
                        "id": file_id,
                        "bytes": size,
                        "filename": f"{batch_id}_{suffix}.jsonl",
                        "purpose": "batch_output",
                        "storageKey": key,
                        "lineCount": lines,
                        "createdAt": int(now),
                        "expiresAt": expires_at,
                    },
                },
            )
        total = (status.get("requestCounts") or {}).get("total", 0)
        failed = total - merged.completed if merged.input_missing else merged.failed
        usage = {
            "inputTokens": merged.input_tokens,
            "cachedTokens": merged.cached_tokens,
            "outputTokens": merged.output_tokens,
            "reasoningTokens": merged.reasoning_tokens,
            "totalTokens": merged.total_tokens,
        }
        result.status.update(
            requestCounts={"total": total, "completed": merged.completed, "failed": failed},
            usage=usage,
            outputFileID=output_id if merged.output_key else None,
            errorFileID=error_id if merged.error_key else None,
        )
        pricing = status.get("pricing")
        charges = dict(status.get("billing") or {})
        if charges.get("mode") == "GPUTime":
            gpu_seconds = _gpu_seconds(status, _gpus_per_slot(status, pool), now)
            result.status["cost"] = billing.final_charge(
                "GPUTime",
                pricing=None,
                input_tokens=0,
                output_tokens=0,
                gpu_seconds=gpu_seconds,
                gpu_hour_price=charges.get("gpuHourPrice"),
            )
            result.status["billing"] = {**charges, "gpuSeconds": gpu_seconds}
        elif pricing:
            result.status["cost"] = cost_of(
                merged.input_tokens,
                merged.output_tokens,
                pricing.get("inputPerMillion", "0"),
                pricing.get("outputPerMillion", "0"),
            )
        if merged.completed + failed != total:
            log.error("batch %s: %d + %d != %d", batch_id, merged.completed, failed, total)
        final = "cancelled" if cancelled else "expired" if expired else "completed"
        if final == "completed" and pool_deleted:
            final = "failed"
            result.status["errors"] = [
                {"code": "pool_deleted", "message": f"Pool {status.get('pool')} was deleted."}
            ]
        if merged.input_missing:
            errors = result.status.setdefault("errors", [])
            errors.append({"code": "input_file_deleted", "message": merged.input_missing})
            result.event("InputFileDeleted", merged.input_missing, warning=True)
        if status.get("status") != "finalizing" or not status.get("finalizingAt"):
            result.status["finalizingAt"] = int(now)
        self._transition(
            result,
            status,
            final,
            now,
            final.capitalize(),
            f"{merged.completed} completed, {failed} failed of {total}",
        )
        await self._cleanup_jobs(meta, status)
        metrics.REQUESTS.labels("completed").inc(merged.completed)
        metrics.REQUESTS.labels("failed").inc(merged.failed)
        metrics.TOKENS.labels("input").inc(merged.input_tokens)
        metrics.TOKENS.labels("output").inc(merged.output_tokens)
        self._last_progress.pop(uid, None)

    # --- deletion ------------------------------------------------------------------------------

    async def delete(self, body: dict[str, Any]) -> None:
        """Remove the batch's Jobs, work area and result bytes (their BatchFiles are owned)."""
        meta = body["metadata"]
        await self._release_on_delete(meta, body.get("status") or {})
        await self._cleanup_jobs(meta, body.get("status") or {})
        prefix = keys.work_prefix(meta["namespace"], meta["uid"]) + "/"
        results = [
            keys.file_key(meta["namespace"], keys.derived_file_id(meta["uid"], purpose))
            for purpose in ("output", "errors")
        ]

        def remove() -> None:
            for info in list(self.store.list(prefix)):
                self.store.delete(info.key)
            for key in results:  # the garbage collector removes the objects, not the bytes
                self.store.delete(key)

        await asyncio.to_thread(remove)
        self._last_progress.pop(meta["uid"], None)
        self._patched_phase.pop(meta["uid"], None)

    async def _release_on_delete(self, meta: dict[str, Any], status: dict[str, Any]) -> None:
        """A batch deleted before it ended gives its reservation back; on a private pool the
        GPU time it used so far is charged, like a cancel."""
        charges = status.get("billing") or {}
        if charges.get("settledAt"):
            return
        charge = "0"
        if charges.get("mode") == "GPUTime":
            pool = await self._pool_or_none(status.get("pool"))
            charge = billing.final_charge(
                "GPUTime",
                pricing=None,
                input_tokens=0,
                output_tokens=0,
                gpu_seconds=_gpu_seconds(status, _gpus_per_slot(status, pool), self.clock()),
                gpu_hour_price=charges.get("gpuHourPrice"),
            )
        await self.credits.settle(meta["namespace"], meta["name"], charge)


def _stamp(value: str | None) -> int | None:
    return unix_seconds(value) if value else None


def _finished_at(job: dict[str, Any]) -> int | None:
    """When a finished Job ended: its completionTime, else its Complete/Failed condition's."""
    job_status = job.get("status") or {}
    if job_status.get("completionTime"):
        return unix_seconds(job_status["completionTime"])
    for cond in job_status.get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return _stamp(cond.get("lastTransitionTime"))
    return None


def _track_run(
    shard: dict[str, Any], started: int | None, finished_at: int | None, active: bool, now: float
) -> None:
    run, since = billing.observe_run(
        int(shard.get("runSeconds") or 0),
        shard.get("runningSince"),
        started=started,
        finished_at=finished_at,
        active=active,
        now=int(now),
    )
    shard["runSeconds"] = run
    if since is None:
        shard.pop("runningSince", None)
    else:
        shard["runningSince"] = since


def _gpu_seconds(status: dict[str, Any], gpus_per_slot: int, now: float) -> int:
    """GPU-seconds of a batch's shards; runs still open (stopped by a cancel) end ``now``."""
    total = 0
    for shard in status.get("shards") or []:
        run, _ = billing.observe_run(
            int(shard.get("runSeconds") or 0),
            shard.get("runningSince"),
            started=None,
            finished_at=None,
            active=False,
            now=int(now),
        )
        total += run
    return total * gpus_per_slot


def _condition(status: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _gpus_per_slot(status: dict[str, Any], pool: BatchPoolSpec | None) -> int:
    """GPUs per shard pod: recorded at acceptance, else the pool's (older batches), else 1."""
    if status.get("gpusPerSlot") is not None:
        return int(status["gpusPerSlot"])
    return pool.gpus_per_slot if pool is not None else 1


def _camel(phase: str) -> str:
    head, *rest = phase.split("_")
    return head + "".join(part.capitalize() for part in rest)
