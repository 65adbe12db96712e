"""The GPU time a batch used: its shards' shares of their slots' busy time.

A slot is busy while at least one request is in its engine; while ``n`` requests are in it each
accrues ``1/n`` of the time to its shard (``executor.slot.BusyLedger``), and the shard's progress
record keeps the sum over its runs. So a batch is charged neither queue time (seed 000: queue
time has no GPU charge) nor a warm slot's idle time nor another batch's share of a shared engine.
"""

from __future__ import annotations

from llmbatch.api.resources import BatchPoolSpec, BatchStatus
from llmbatch.core import billing


def gpu_seconds(status: BatchStatus, gpus: int) -> int:
    """GPU-seconds of a batch: its shards' busy shares (``run_seconds``) times GPUs per slot."""
    return sum(shard.run_seconds for shard in status.shards or []) * gpus


def gpu_time_charge(
    status: BatchStatus, pool: BatchPoolSpec | None, gpu_hour_price: str | None
) -> tuple[int, str]:
    """(GPU-seconds used, their cost) of a batch on a GPUTime pool."""
    used = gpu_seconds(status, gpus_per_slot(status, pool))
    charge = billing.final_charge(
        "GPUTime",
        pricing=None,
        input_tokens=0,
        output_tokens=0,
        gpu_seconds=used,
        gpu_hour_price=gpu_hour_price,
    )
    return used, charge


def gpus_per_slot(status: BatchStatus, pool: BatchPoolSpec | None) -> int:
    """GPUs per shard pod: recorded at acceptance, else the pool's (older batches), else 1."""
    if status.gpus_per_slot is not None:
        return status.gpus_per_slot
    return pool.gpus_per_slot if pool is not None else 1
