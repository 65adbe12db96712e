"""The GPU time a batch used: its shards' shares of their slots' busy time.

A slot is busy while at least one request is in its engine; while ``n`` requests are in it each
accrues ``1/n`` of the time (``executor.sharedengine.BusyLedger``); each answer carries its
share, and the shard's progress record keeps the sum over its committed chunks, so work cut off
and re-run (or a failed attempt that was retried) is charged once. So a batch is charged neither
queue time (seed 000: queue time has no GPU charge) nor a warm slot's idle time nor another
batch's share of a shared engine.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

from llmbatch.api.resources import BatchPoolSpec, BatchStatus
from llmbatch.core import billing, keys, shardbook
from llmbatch.storage.base import ObjectStore
from llmbatch.storage.shardresults import read_progress


def gpu_seconds(busy: Iterable[float], gpus: int) -> int:
    """GPU-seconds of a batch: the sum of its shards' busy shares times GPUs per slot, rounded
    up once for the batch (rounding each shard up would charge a batch of many short shards a
    second per shard)."""
    return math.ceil(round(sum(busy) * gpus, 3))


async def busy_shares(
    store: ObjectStore, namespace: str, uid: str, status: BatchStatus
) -> dict[int, float]:
    """Each shard's busy share by index, as its progress record has it now (the status's
    ``runSeconds`` is folded at most every progress interval, and rounded)."""
    listed = {s.index: float(s.run_seconds) for s in status.shards or []}
    shares = {}
    for index in shardbook.shard_indexes(status.shards, status.shard_plan):
        prefix = keys.shard_prefix(namespace, uid, index)
        progress = await asyncio.to_thread(read_progress, store, prefix)
        shares[index] = listed.get(index, 0.0) if progress is None else progress.busy_seconds
    return shares


async def gpu_time_charge(
    store: ObjectStore,
    namespace: str,
    uid: str,
    status: BatchStatus,
    pool: BatchPoolSpec | None,
    gpu_hour_price: str | None,
) -> tuple[int, str]:
    """(GPU-seconds used, their cost) of a batch on a GPUTime pool: the one rule both its end
    and its deletion before its end charge by."""
    busy = await busy_shares(store, namespace, uid, status)
    return charge_of(busy, status, pool, gpu_hour_price)


def charge_of(
    busy: dict[int, float],
    status: BatchStatus,
    pool: BatchPoolSpec | None,
    gpu_hour_price: str | None,
) -> tuple[int, str]:
    """(GPU-seconds used, their cost) from the shards' busy shares (:func:`busy_shares`)."""
    used = gpu_seconds(busy.values(), gpus_per_slot(status, pool))
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
