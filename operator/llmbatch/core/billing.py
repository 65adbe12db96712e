"""Credit maths: the estimate reserved at acceptance, the charge at the end, the account ledger.

Pure: functions take data (and the time) and return data; the gateway and the operator do the
API calls around them (read the CreditAccount, apply one of these, write it back with its
resourceVersion, retry on conflict). docs/billing.md explains the rules with a worked example.

Money is :class:`decimal.Decimal`, written as strings with six decimals; never a float.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from typing import Any

from llmbatch.api.resources import (
    BatchBilling,
    BatchPoolSpec,
    CreditAccountStatus,
    CreditReservation,
    Pricing,
)
from llmbatch.core.validation.media import MediaTally

ESTIMATE_BYTES_PER_TOKEN = 3
"""Input bytes per estimated input token: below real tokenizers' ~4 for English, so the estimate
errs high (JSON framing counts too), and still covers escaped non-Latin text."""
ESTIMATE_IMAGE_TOKENS = 1536
"""Input tokens assumed per image, whatever its size: above what common vision encoders make of
one image (LLaVA-1.5 576, a 1024x1024 image in Qwen2-VL ~1,350), never its base64 as text."""
ESTIMATE_AUDIO_BYTES_PER_TOKEN = 320
"""Inline audio bytes per assumed input token: 16 kB/s (128 kbit/s, or 8 kHz 16-bit PCM) at 50
tokens per second of audio, above Whisper-style encoders' 25-50; errs high for 16 kHz WAV."""
ESTIMATE_AUDIO_CLIP_TOKENS = 1500
"""Input tokens assumed per audio clip given by URL (its length unknown: 30 s) and at least per
inline clip."""
MAX_RESERVATIONS = 1000
"""Unfinished batches one account can hold credit for (the ledger lives on one object)."""
RESERVED_ANNOTATION = "llmbatch.io/credit-reserved"
"""On a Batch the gateway reserved credit for at creation (``"true"``): its acceptance reads the
tenant's account rather than trust an earlier read that found none (the account can be newer
than that read while the operator's watch has not shown it yet)."""
_QUANTUM = Decimal("0.000001")


def money(value: Decimal) -> str:
    """A money amount as the API stores it: six decimals, rounded half up."""
    return str(value.quantize(_QUANTUM, rounding=ROUND_HALF_UP))


def _ceil(value: Decimal) -> Decimal:
    return value.quantize(_QUANTUM, rounding=ROUND_CEILING)


# --- estimate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSize:
    """What is known of a batch's input at acceptance (from the validated file or requests)."""

    input_bytes: int
    requests: int
    output_token_limits: int
    """Sum of the output-token limits the requests declare."""
    requests_without_output_limit: int
    """Requests that declare none (the pool's default is assumed for each)."""
    media: MediaTally = field(default_factory=MediaTally)
    """The image and audio parts of the requests (counted by their own rule)."""


@dataclass(frozen=True)
class Estimate:
    """The credit to reserve, and the tokens it assumed."""

    input_tokens: int
    output_tokens: int
    amount: Decimal

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def estimate_input_tokens(input_bytes: int, media: MediaTally | None = None) -> int:
    """Input tokens assumed for ``input_bytes`` of JSONL (rounded up): its text at
    :data:`ESTIMATE_BYTES_PER_TOKEN`, and its ``media`` by theirs instead of as text."""
    text_bytes = max(0, input_bytes - (media.encoded_bytes if media else 0))
    tokens = -(-text_bytes // ESTIMATE_BYTES_PER_TOKEN)
    if media is not None and not media.empty:
        audio = max(
            -(-media.audio_bytes // ESTIMATE_AUDIO_BYTES_PER_TOKEN),
            media.audio_clips * ESTIMATE_AUDIO_CLIP_TOKENS,
        )
        tokens += media.images * ESTIMATE_IMAGE_TOKENS + audio
    return tokens


def estimate_output_tokens(size: BatchSize, default_output_tokens: int) -> int:
    """Declared output limits, plus the pool's default for each request without one."""
    return size.output_token_limits + size.requests_without_output_limit * default_output_tokens


def gpu_cost(gpu_seconds: int, gpu_hour_price: str) -> Decimal:
    """Price of ``gpu_seconds`` at a GPU-hour price."""
    return Decimal(max(0, gpu_seconds)) * Decimal(gpu_hour_price) / Decimal(3600)


def token_cost(input_tokens: int, output_tokens: int, pricing: Pricing) -> Decimal:
    """Price of tokens at per-1M-token prices."""
    return (
        Decimal(input_tokens) * Decimal(pricing.input_per_million)
        + Decimal(output_tokens) * Decimal(pricing.output_per_million)
    ) / Decimal(1_000_000)


def estimate_batch(
    pool: BatchPoolSpec, pricing: Pricing, size: BatchSize, throughput_per_slot: str | None = None
) -> Estimate:
    """The reservation of a batch on ``pool`` at its tier's ``pricing`` (rounded up).

    Tokens mode: estimated input tokens at the input price plus declared (or default) output
    tokens at the output price. GPUTime mode: the requests at the pool's (learned) throughput per
    slot, times the slot's GPUs, at the GPU-hour price.
    """
    input_tokens = estimate_input_tokens(size.input_bytes, size.media)
    output_tokens = estimate_output_tokens(size, pool.billing.default_output_tokens)
    if pool.billing.mode == "GPUTime":
        throughput = Decimal(throughput_per_slot or pool.throughput_per_slot)
        if throughput <= 0:
            throughput = Decimal(1)
        slot_seconds = int((Decimal(size.requests) / throughput).to_integral_value(ROUND_CEILING))
        amount = gpu_cost(slot_seconds * pool.gpus_per_slot, pool.billing.gpu_hour_price)
        return Estimate(input_tokens, output_tokens, _ceil(amount))
    return Estimate(
        input_tokens, output_tokens, _ceil(token_cost(input_tokens, output_tokens, pricing))
    )


def new_reservation(
    *,
    batch: str,
    pool_name: str,
    pool: BatchPoolSpec,
    pricing: Pricing,
    estimate: Estimate,
    created_at: int,
) -> CreditReservation:
    """The credit entry of a batch about to run on ``pool``: the estimate, and the terms it will
    be charged at (token prices of its tier, or the pool's GPU-hour price)."""
    gpu_mode = pool.billing.mode == "GPUTime"
    return CreditReservation(
        batch=batch,
        amount=money(estimate.amount),
        estimated_tokens=estimate.tokens,
        pool=pool_name,
        mode=pool.billing.mode,
        pricing=None if gpu_mode else pricing,
        gpu_hour_price=pool.billing.gpu_hour_price if gpu_mode else None,
        created_at=created_at,
    )


def accepted_reservation(
    held: CreditReservation,
    entry: CreditReservation,
    pool: BatchPoolSpec,
    size: BatchSize,
    throughput_per_slot: str | None = None,
) -> CreditReservation:
    """What a batch must hold once its input is validated, given ``held`` from its creation.

    ``held`` was estimated from the sizes recorded on the BatchFile, which whoever may write
    BatchFiles can change; ``entry`` is the operator's reservation for the validated ``size`` on
    the pool it chose. Made for that pool, ``held`` keeps its terms (mode and prices, fixed at
    creation) and its amount and tokens are raised to the estimate of ``size`` at those terms
    when that is more. Made for another pool (the file's recorded model was not its input's),
    its terms are not the batch's: ``entry`` replaces it.
    """
    if held.pool != entry.pool:
        return entry
    terms = pool.billing.model_copy(
        update={
            "mode": held.mode,
            "gpu_hour_price": held.gpu_hour_price or pool.billing.gpu_hour_price,
        }
    )
    needed = estimate_batch(
        pool.model_copy(update={"billing": terms}),
        held.pricing or Pricing(),
        size,
        throughput_per_slot,
    )
    amount = max(Decimal(held.amount), needed.amount)
    tokens = max(held.estimated_tokens, needed.tokens)
    if amount == Decimal(held.amount) and tokens == held.estimated_tokens:
        return held
    return held.model_copy(update={"amount": money(amount), "estimated_tokens": tokens})


# --- usage -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenUsage:
    """The tokens one successful response reports: what ``status.usage`` and a Tokens-mode charge
    sum. Input tokens are billed at the input price, output tokens at the output price; cached
    and reasoning tokens are details of those two (already counted in them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


_USAGE_SHAPES: tuple[tuple[str, str, str, str], ...] = (
    ("prompt_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"),
    ("input_tokens", "output_tokens", "input_tokens_details", "output_tokens_details"),
)
"""The two ``usage`` shapes: chat/completions/embeddings (prompt/completion) and /v1/responses
(input/output): the input, output, input-details and output-details fields of each."""


def token_usage(body: Mapping[str, Any]) -> TokenUsage:
    """The usage a response body reports, in either shape (zeros for what is absent or not a
    non-negative integer). ``total_tokens`` defaults to input + output when absent."""
    usage = body.get("usage")
    if not isinstance(usage, Mapping):
        return TokenUsage()
    shape = next((s for s in _USAGE_SHAPES if s[0] in usage or s[1] in usage), _USAGE_SHAPES[0])
    input_name, output_name, input_details, output_details = shape
    inputs, outputs = _count(usage, input_name), _count(usage, output_name)
    cached, reasoning = usage.get(input_details), usage.get(output_details)
    return TokenUsage(
        input_tokens=inputs,
        output_tokens=outputs,
        total_tokens=_count(usage, "total_tokens") or inputs + outputs,
        cached_tokens=_count(cached, "cached_tokens") if isinstance(cached, Mapping) else 0,
        reasoning_tokens=(
            _count(reasoning, "reasoning_tokens") if isinstance(reasoning, Mapping) else 0
        ),
    )


def _count(fields: Mapping[str, Any], name: str) -> int:
    value = fields.get(name)
    return value if type(value) is int and value > 0 else 0


# --- charge ------------------------------------------------------------------------------------


def final_charge(
    mode: str,
    *,
    pricing: Pricing | None,
    input_tokens: int,
    output_tokens: int,
    gpu_seconds: int = 0,
    gpu_hour_price: str | None = None,
) -> str:
    """What a finished batch costs.

    Tokens mode: the usage of the final output file (successful results only) at the prices
    fixed at acceptance. GPUTime mode: the GPU time its shards used, work before a cancel or a
    failure included; no token charge. A batch that never ran costs nothing either way.
    """
    if mode == "GPUTime":
        return money(gpu_cost(gpu_seconds, gpu_hour_price or "0"))
    if pricing is None:
        return money(Decimal(0))
    return money(token_cost(input_tokens, output_tokens, pricing))


# --- the account ledger ------------------------------------------------------------------------


class InsufficientCredit(Exception):
    """The account cannot hold the reservation."""

    def __init__(self, needed: Decimal, available: Decimal, currency: str) -> None:
        super().__init__(
            f"Insufficient credit: this batch needs an estimated {money(needed)} {currency}, "
            f"{money(available)} {currency} is available. Add credit or submit a smaller batch."
        )
        self.needed = needed
        self.available = available


class TooManyReservations(Exception):
    """The account holds credit for as many unfinished batches as it can."""

    def __init__(self) -> None:
        super().__init__(
            f"Too many unfinished batches: at most {MAX_RESERVATIONS} can hold credit at once. "
            "Retry after some batches complete."
        )


def totals(limit: str, status: CreditAccountStatus) -> CreditAccountStatus:
    """``status`` with ``reserved``, ``available`` and ``activeBatches`` recomputed."""
    entries = status.reservations or []
    reserved = sum((Decimal(e.amount) for e in entries), Decimal(0))
    charged = Decimal(status.charged)
    return status.model_copy(
        update={
            "reserved": money(reserved),
            "charged": money(charged),
            "available": money(Decimal(limit) - reserved - charged),
            "active_batches": len(entries),
            "reservations": entries or None,
        }
    )


def available(limit: str, status: CreditAccountStatus) -> Decimal:
    """Credit left for new reservations."""
    return Decimal(totals(limit, status).available or "0")


def find(status: CreditAccountStatus, batch: str) -> CreditReservation | None:
    """The reservation of ``batch``, if it holds one."""
    return next((e for e in status.reservations or [] if e.batch == batch), None)


def reserve(
    limit: str, currency: str, status: CreditAccountStatus, entry: CreditReservation
) -> CreditAccountStatus | None:
    """The account with ``entry`` added; None when the batch holds a reservation already.

    Raises :class:`InsufficientCredit` when the amount is more than is available (a batch that
    costs nothing always fits) and :class:`TooManyReservations` when the ledger is full.
    """
    if find(status, entry.batch) is not None:
        return None
    amount = Decimal(entry.amount)
    left = available(limit, status)
    if amount > 0 and amount > left:
        raise InsufficientCredit(amount, left, currency)
    if len(status.reservations or []) >= MAX_RESERVATIONS:
        raise TooManyReservations()
    entries = [*(status.reservations or []), entry]
    return totals(limit, status.model_copy(update={"reservations": entries}))


def top_up(
    limit: str, currency: str, status: CreditAccountStatus, wanted: CreditReservation
) -> CreditAccountStatus | None:
    """The account with ``wanted.batch``'s reservation replaced by ``wanted`` (acceptance).

    None when the batch holds no reservation (nothing to raise: it ended, or never reserved) or
    holds ``wanted`` already, so a validation that runs again changes nothing. Raises
    :class:`InsufficientCredit` when the increase is more than is available.
    """
    held = find(status, wanted.batch)
    if held is None or held == wanted:
        return None
    increase = Decimal(wanted.amount) - Decimal(held.amount)
    left = available(limit, status)
    if increase > 0 and increase > left:
        raise InsufficientCredit(Decimal(wanted.amount), Decimal(held.amount) + left, currency)
    entries = [wanted if e.batch == wanted.batch else e for e in status.reservations or []]
    return totals(limit, status.model_copy(update={"reservations": entries}))


def settle(
    limit: str, status: CreditAccountStatus, batch: str, charge: str
) -> CreditAccountStatus | None:
    """Release ``batch``'s reservation and charge ``charge``, in one step.

    None when the batch holds no reservation: it was settled before (finalisation ran again) or
    never reserved, and nothing is charged — so a batch is charged at most once.
    """
    if find(status, batch) is None:
        return None
    entries = [e for e in status.reservations or [] if e.batch != batch]
    charged = Decimal(status.charged) + max(Decimal(0), Decimal(charge))
    return totals(
        limit, status.model_copy(update={"reservations": entries, "charged": money(charged)})
    )


def holds_reservation(recorded: BatchBilling | None) -> bool:
    """Whether a batch may hold a reservation its end must release (and charge).

    A batch whose acceptance recorded no account holds none: acceptance found the tenant
    without one, and an account made later holds no reservation of a batch already accepted
    (:func:`settle` would find none and charge nothing) — so its end needs no read of the
    account. Without a record (acceptance never ran, or the gateway reserved before a
    validation that refused the batch) it may hold one: the account is read.
    """
    return recorded is None or recorded.account is not None


def collect(
    limit: str, status: CreditAccountStatus, keep: Callable[[CreditReservation], bool]
) -> tuple[CreditAccountStatus, list[CreditReservation]]:
    """Drop the reservations ``keep`` rejects (their batch is gone) without charging them."""
    kept = [e for e in status.reservations or [] if keep(e)]
    dropped = [e for e in status.reservations or [] if not keep(e)]
    return totals(limit, status.model_copy(update={"reservations": kept})), dropped
