"""The ``validating`` phase: read the input, pick the pool, check every line against its limits,
reserve credit, pin the input, plan the shards — or fail the batch with the reasons."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from llmbatch.api.resources import (
    CREDIT_ACCOUNT_NAME,
    BatchBilling,
    BatchEndReason,
    BatchPoolSpec,
    BatchSpec,
    Phase,
    Pricing,
    RequestCounts,
    ShardPlanRef,
    SucceededShards,
    ValidationError,
)
from llmbatch.controller import metrics
from llmbatch.controller.batches.step import (
    BatchView,
    Rejected,
    Step,
    error,
    errors_of,
    transition,
)
from llmbatch.controller.credits import CreditLedger
from llmbatch.controller.kube import Kube
from llmbatch.controller.poolcatalog import PoolCatalog
from llmbatch.core import billing, keys, shardbook, tiers
from llmbatch.core.admission import (
    check_pool_queue,
    check_tier,
    max_requests,
    media_rules,
    output_limit_required,
)
from llmbatch.core.ids import batch_id_from_name
from llmbatch.core.inline import InvalidInlineRequest, inline_file
from llmbatch.core.quotas import TenantCaps, check_waiting_batches, count_accepted_waiting
from llmbatch.core.tenancy import Tenant, pool_serves
from llmbatch.core.validation import (
    ErrorCode,
    InvalidLine,
    ValidationLimits,
    ValidationResult,
    iter_lines,
    validate_stream,
)
from llmbatch.core.validation.shards import ShardRange
from llmbatch.storage.base import IntegrityError, ObjectInfo, ObjectNotFound, ObjectStore

Pool = tuple[str, BatchPoolSpec, dict[str, Any]]
"""(name, spec, status) of the BatchPool a batch runs on."""


def fail(
    step: Step, batch: BatchView, errors: list[ValidationError], now: float, total: int = 0
) -> None:
    """End the batch ``failed`` with ``errors`` (the first 100) before anything ran."""
    step.set(
        errors=errors[:100],
        request_counts=RequestCounts(total=total, completed=0, failed=total),
    )
    first = errors[0] if errors else error("invalid_input", "invalid input")
    where = f" (line {first.line})" if first.line else ""
    transition(
        step,
        batch,
        Phase.FAILED,
        now,
        BatchEndReason.VALIDATION_FAILED,
        f"{len(errors)} validation error(s); first: {first.message}{where}",
    )


class Validation:
    """Runs the ``validating`` phase of one batch per call (idempotent: derived keys only)."""

    def __init__(
        self,
        kube: Kube,
        store: ObjectStore,
        credits: CreditLedger,
        pools: PoolCatalog,
        clock: Callable[[], float],
        remote_media: bool = False,
        *,
        caps: TenantCaps | None = None,
    ) -> None:
        self.kube = kube
        self.store = store
        self.credits = credits
        self.pools = pools
        self.clock = clock
        self.remote_media = remote_media
        """Whether rows may give media as http(s) URLs (``OperatorConfig.remote_media``)."""
        self.namespace_annotations: Callable[[str], dict[str, str] | None] = lambda _ns: None
        """A namespace's annotations from the operator's watch (None: not seen; read it)."""
        self.namespace_labels: Callable[[str], dict[str, str] | None] = lambda _ns: None
        """A namespace's labels from the operator's watch (None: not seen; read it)."""
        self.accepted_batches: Callable[[str], int | None] = lambda _ns: None
        """How many of a namespace's batches are accepted and not finished, from the operator's
        cache (None: not known yet; list them)."""
        self.caps = caps or TenantCaps()
        """The caps of a tenant whose namespace sets none."""

    async def run(self, batch: BatchView, step: Step, now: float) -> None:
        started = time.perf_counter()
        try:
            input_key, pool, verdict = await self._check(batch)
            pinned = keys.inline_input_key(batch.namespace, batch.uid)
            if input_key != pinned:
                input_key = await self._pin_input(batch, input_key, verdict.total_bytes)
            charges, pricing = await self._reserve(batch, pool, verdict)
        except Rejected as rejected:
            fail(step, batch, rejected.errors, now, total=rejected.total)
            return
        finally:
            metrics.VALIDATION_SECONDS.observe(time.perf_counter() - started)
        plan = await self._store_plan(batch, verdict.shards)
        self._accept(batch, step, now, input_key, pool, verdict, charges, pricing, plan)

    async def _store_plan(self, batch: BatchView, shards: list[ShardRange]) -> ShardPlanRef | None:
        """A plan too long to list in the status goes to the store (the same bytes each time
        the same input is validated, so a step repeated after a lost patch writes them again)."""
        if not shardbook.is_stored(shards):
            return None
        key = keys.shard_plan_key(batch.namespace, batch.uid)
        await asyncio.to_thread(self.store.put, key, shardbook.plan_document(shards))
        return shardbook.plan_ref(key, shards)

    async def _check(self, batch: BatchView) -> tuple[str, Pool, ValidationResult]:
        """The input key, the pool and the validator's verdict, or :class:`Rejected`."""
        spec = batch.spec
        too_long = tiers.window_refusal(spec.completion_window)
        if too_long is not None:
            raise Rejected([error("invalid_completion_window", too_long, "completionWindow")])
        await self._check_waiting(batch)
        input_key, model = await self._input_and_model(batch)
        if model is None:
            # No line names a model: report every problem the default limits find.
            verdict = await asyncio.to_thread(
                self._run_validator, input_key, spec.endpoint, ValidationLimits(), 1000
            )
            if not verdict.ok:
                raise Rejected(errors_of([e.as_dict() for e in verdict.errors]))
        pool = await self._choose_pool(batch.namespace, spec, model)
        name, pool_spec, pool_status = pool
        await self._check_tier(batch.namespace, spec, name, pool_spec)
        limits = ValidationLimits(
            max_requests=max_requests(pool_spec),
            max_bytes=pool_spec.limits.max_bytes,
            max_line_bytes=pool_spec.limits.max_line_bytes,
            require_output_token_limit=output_limit_required(pool_spec),
            media=media_rules(pool_spec, model, self.remote_media),
        )
        verdict = await asyncio.to_thread(
            self._run_validator, input_key, spec.endpoint, limits, pool_spec.shard_requests
        )
        if not verdict.ok:
            raise Rejected(
                errors_of([e.as_dict() for e in verdict.errors]), total=verdict.request_count
            )
        # Fail fast rather than queue without bound (the gateway answers 429 up front).
        refusal = check_pool_queue(name, pool_spec, pool_status, verdict.request_count)
        if refusal is not None:
            raise Rejected([error(refusal.code, refusal.message)], total=verdict.request_count)
        return input_key, pool, verdict

    def _accept(
        self,
        batch: BatchView,
        step: Step,
        now: float,
        input_key: str,
        pool: Pool,
        verdict: ValidationResult,
        charges: BatchBilling,
        pricing: Pricing,
        plan: ShardPlanRef | None,
    ) -> None:
        name, spec, _ = pool
        revision = next((m.revision for m in spec.models if m.name == verdict.model), None)
        step.set(
            billing=charges,
            model=verdict.model,
            model_revision=revision,
            pool=name,
            worker_namespace=spec.worker_namespace,
            gpus_per_slot=spec.gpus_per_slot,
            input_key=input_key,
            input_bytes=verdict.total_bytes,
            request_counts=RequestCounts(total=verdict.request_count),
            pricing=pricing,
            shards=[] if plan else [shardbook.waiting_shard(s) for s in verdict.shards],
            shard_plan=plan,
            succeeded_shards=SucceededShards() if plan else None,
        )
        transition(
            step,
            batch,
            Phase.IN_PROGRESS,
            now,
            "Validated",
            f"{verdict.request_count} requests for {verdict.model}"
            f"{f' (revision {revision})' if revision else ''} in {len(verdict.shards)} "
            f"shards on pool {name}",
        )

    # --- the input -----------------------------------------------------------------------------

    async def _input_and_model(self, batch: BatchView) -> tuple[str, str | None]:
        """The input's key and the model of its first line that names one."""
        requests = batch.spec.requests
        if requests is None:
            key = await self._input_key(batch)
            return key, await asyncio.to_thread(self._peek_model, key)
        # applied with kubectl: the requests are in the object; stored and peeked at in one
        # call to a store thread (under a burst each call waits its turn on a busy loop)
        key = keys.inline_input_key(batch.namespace, batch.uid)
        try:
            data = inline_file(requests).data
        except InvalidInlineRequest as bad:  # not even encodable as a line: refused as one
            raise Rejected(errors_of([bad.problem.as_dict()]), total=len(requests)) from bad

        def store() -> str | None:
            self.store.put(key, data)
            return first_model([data])

        return key, await asyncio.to_thread(store)

    async def _input_key(self, batch: BatchView) -> str:
        """The key of an uploaded or staged input (``requests``: :meth:`_input_and_model`)."""
        spec = batch.spec
        if spec.inline_input is not None:
            return await self._staged_input(batch)
        file_id = spec.input_file_id or ""
        batch_file = await self.kube.get_custom("batchfiles", batch.namespace, file_id)
        if batch_file is None:
            raise Rejected([error("invalid_file", f"No such file: {file_id}", "input_file_id")])
        file_spec = batch_file.get("spec") or {}
        if file_spec.get("purpose") != "batch":
            purpose = file_spec.get("purpose")
            raise Rejected(
                [
                    error(
                        "invalid_file_purpose",
                        f"File {file_id} has purpose {purpose!r}, not 'batch'.",
                        "input_file_id",
                    )
                ]
            )
        storage_key = keys.owned_file_key(batch.namespace, file_id, file_spec.get("storageKey"))
        if storage_key is None:
            message = f"File {file_id} names storage outside its own file; refusing to read it."
            raise Rejected([error("invalid_file", message, "input_file_id")])
        if await asyncio.to_thread(self.store.head, storage_key) is None:
            raise Rejected(
                [error("invalid_file", f"The bytes of {file_id} are gone.", "input_file_id")]
            )
        return storage_key

    async def _staged_input(self, batch: BatchView) -> str:
        """The inline requests the gateway stored at creation: only at the key derived from the
        batch's own namespace and id (a Batch applied by hand cannot name another's), with the
        size the gateway recorded. Pinning removes the staged copy; an operator that stopped
        between that and the status patch finds the pinned copy on its next pass."""
        staged = batch.spec.inline_input
        assert staged is not None
        key = keys.inline_staging_key(batch.namespace, batch_id_from_name(batch.name))
        if staged.key != key:
            message = f"inlineInput.key must be {key}; refusing to read {staged.key}"
            raise Rejected([error("invalid_input", message, "inlineInput")])
        info = await asyncio.to_thread(self.store.head, key)
        if info is None:
            pinned = keys.inline_input_key(batch.namespace, batch.uid)
            info = await asyncio.to_thread(self.store.head, pinned)
            if info is not None and info.size == staged.bytes:
                return pinned
        if info is not None and info.sha256 and info.sha256 != staged.sha256:
            raise Rejected([error("invalid_input", "The inline requests changed.", "inlineInput")])
        if info is None or info.size != staged.bytes:
            found = "gone" if info is None else f"{info.size} bytes, not {staged.bytes}"
            raise Rejected([error("invalid_input", f"The inline requests are {found}.")])
        return key

    async def _pin_input(self, batch: BatchView, key: str, size: int) -> str:
        """Copy the validated input into the batch's work area; the shards and finalisation read
        the copy, so a user may delete the file (OpenAI allows it) while the batch runs: it leaves
        the API at once, and the bytes the batch needs stay until its work area is removed.
        Server-side on S3 (UploadPartCopy); the validated size is checked on the copy."""
        pinned = keys.inline_input_key(batch.namespace, batch.uid)
        try:
            await asyncio.to_thread(self.store.compose, pinned, [ObjectInfo(key=key, size=size)])
        except (ObjectNotFound, IntegrityError) as exc:
            message = f"The input file changed or is gone: {exc}"
            raise Rejected([error("invalid_file", message)]) from exc
        if batch.spec.inline_input is not None:  # the staged copy is the batch's: now pinned
            await asyncio.to_thread(self.store.delete, key)
        return pinned

    def _peek_model(self, key: str) -> str | None:
        return first_model(self.store.iter_range(key))

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
            raise Rejected([error("invalid_file", "The input file is gone.")]) from exc

    # --- the pool ------------------------------------------------------------------------------

    async def _choose_pool(self, namespace: str, spec: BatchSpec, model: str | None) -> Pool:
        """The pool for the batch: one serving its model to its tenant (defence in depth behind
        the gateway's 404: another tenant's private deployment is as unknown as no pool)."""
        if model is None:
            missing = InvalidLine(
                ErrorCode.MISSING_MODEL, "No line of the input names a model.", None, "body.model"
            )
            raise Rejected(errors_of([missing.as_dict()]))
        tenant = await self._tenant(namespace)
        chosen, pools = await self.pools.choose(model, spec.pool, tenant)
        if chosen is not None:
            spec_of = BatchPoolSpec.model_validate(chosen.get("spec") or {})
            return chosen["metadata"]["name"], spec_of, chosen.get("status") or {}
        served = {
            m.get("name")
            for p in pools
            if pool_serves(p, tenant)
            for m in (p.get("spec") or {}).get("models") or []
        }
        where = f"pool {spec.pool!r}" if spec.pool else "any pool"
        listing = ", ".join(sorted(str(name) for name in served)) or "none"
        # a line may name any model: cut it so the message fits status.errors (4096 characters)
        shown = model if len(model) <= 256 else model[:256] + "…"
        message = f"Model {shown!r} is not served by {where}. Served models: {listing}."
        raise Rejected([error("model_not_found", message, "body.model")])

    async def _tenant(self, namespace: str) -> Tenant:
        labels = self.namespace_labels(namespace)
        if labels is None:
            labels = await self.kube.namespace_labels(namespace) or {}
        return Tenant(namespace, labels)

    async def _annotations(self, namespace: str) -> dict[str, str]:
        annotations = self.namespace_annotations(namespace)
        if annotations is None:
            annotations = await self.kube.namespace_annotations(namespace) or {}
        return annotations

    async def _check_waiting(self, batch: BatchView) -> None:
        """The tenant's cap on unfinished batches, counting its accepted ones: the gateway
        checked it at creation; a Batch applied with kubectl meets it here only."""
        caps = TenantCaps.of(await self._annotations(batch.namespace), self.caps)
        if caps.waiting_batches is None:
            return
        accepted = self.accepted_batches(batch.namespace)
        if accepted is None:
            listed = await self.kube.list_custom("batches", batch.namespace)
            accepted = count_accepted_waiting(listed)
        refused = check_waiting_batches(accepted, caps.waiting_batches)
        if refused is not None:
            raise Rejected([error(refused.code, refused.message)])

    async def _check_tier(
        self, namespace: str, spec: BatchSpec, pool_name: str, pool: BatchPoolSpec
    ) -> None:
        if spec.priority != "expedited":
            return
        annotations = await self._annotations(namespace)
        if tiers.expedited_disabled(annotations):
            message = "Expedited priority is disabled for this organization."
            raise Rejected([error("expedited_not_allowed", message, "priority")])
        refused = check_tier(pool_name, pool, spec.priority)
        if refused is not None:
            raise Rejected([error(refused.code, refused.message, refused.param)])

    # --- credit --------------------------------------------------------------------------------

    async def _reserve(
        self, batch: BatchView, pool: Pool, verdict: ValidationResult
    ) -> tuple[BatchBilling, Pricing]:
        """Credit at acceptance: ``(status.billing, status.pricing)``.

        The gateway reserved at creation (its prices are fixed on the batch) unless the Batch
        came from kubectl or the model had no pool then; the operator reserves the estimate now
        in that case. The gateway estimated from the sizes on the BatchFile, which whoever may
        write BatchFiles can change: a reservation short of the estimate of the validated input
        is topped up now (``insufficient_credit`` when that does not fit). A tenant without a
        CreditAccount is not limited.
        """
        name, spec, status = pool
        tier_pricing = getattr(spec.tiers, tiers.tier_of(batch.spec.priority, batch.spec.metadata))
        tier_pricing = tier_pricing.pricing
        size = billing.BatchSize(
            input_bytes=verdict.total_bytes,
            requests=verdict.request_count,
            output_token_limits=verdict.declared_output_tokens,
            requests_without_output_limit=verdict.requests_without_output_limit,
            media=verdict.media,
        )
        throughput = status.get("throughputPerSlot")
        entry = billing.new_reservation(
            batch=batch.name,
            pool_name=name,
            pool=spec,
            pricing=tier_pricing,
            estimate=billing.estimate_batch(spec, tier_pricing, size, throughput),
            created_at=int(self.clock()),
        )
        try:
            hold = await self.credits.reserve(
                batch.namespace, entry, reserved_at_creation=batch.credit_reserved
            )
            if hold is not None and not hold.added:
                wanted = billing.accepted_reservation(hold.entry, entry, spec, size, throughput)
                if wanted != hold.entry:
                    hold = await self.credits.top_up(batch.namespace, wanted) or hold
        except (billing.InsufficientCredit, billing.TooManyReservations) as exc:
            code = "insufficient_credit"
            if isinstance(exc, billing.TooManyReservations):
                code = "too_many_batches"
            raise Rejected([error(code, str(exc))], total=verdict.request_count) from exc
        held = hold.entry if hold is not None else None
        fixed = held or entry
        if fixed.mode == "GPUTime":
            pricing = Pricing(currency=tier_pricing.currency)  # no separate token charge
        else:
            pricing = fixed.pricing or tier_pricing
        charges = BatchBilling(
            mode=fixed.mode,
            estimated_tokens=fixed.estimated_tokens,
            reserved=fixed.amount if held is not None else "0",
            gpu_hour_price=fixed.gpu_hour_price,
            account=CREDIT_ACCOUNT_NAME if held is not None else None,
        )
        if hold is not None and hold.added:
            # only what this call reserved: the gateway counts its own, a rerun adds nothing
            tenant = self.credits.tenant_label(batch.namespace)
            metrics.CREDITS_RESERVED.labels(tenant).inc(float(hold.added))
        return charges, pricing


def first_model(chunks: Iterable[bytes]) -> str | None:
    """The model of the first readable line (chooses the pool whose limits then apply)."""
    for _, raw in iter_lines(chunks):
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        body = line.get("body") if isinstance(line, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str) and model:
            return model
    return None
