"""GPU time is charged by one rule, rounded once per batch (#31: before, each shard's busy share
was rounded up, so a batch of many short shards paid a second per shard, and a batch deleted
before its end was charged from the status's folded copy instead of the progress records)."""

from __future__ import annotations

import asyncio
import pathlib

from llmbatch.api.resources import BatchStatus
from llmbatch.controller.batches.gputime import gpu_seconds, gpu_time_charge
from llmbatch.core import keys
from llmbatch.storage import FilesystemStore
from llmbatch.storage.shardresults import Progress


def test_busy_shares_are_summed_then_rounded_up_once() -> None:
    assert gpu_seconds([0.1] * 100, gpus=1) == 10
    assert gpu_seconds([0.25, 0.25], gpus=2) == 1
    assert gpu_seconds([0.3333, 0.3333, 0.3334], gpus=1) == 1
    assert gpu_seconds([], gpus=8) == 0


def test_the_charge_reads_the_progress_records_not_the_folded_status(
    tmp_path: pathlib.Path,
) -> None:
    store = FilesystemStore(tmp_path)
    status = BatchStatus.model_validate(
        {
            "gpusPerSlot": 2,
            "shards": [
                {
                    "index": i,
                    "start": 0,
                    "end": 1,
                    "firstLine": 1,
                    "lineCount": 1,
                    "requestCount": 1,
                }
                for i in range(3)
            ],
        }
    )
    for i, busy in enumerate((1.2, 0.4, 0.0)):
        progress = Progress(batch_id="batch_x", shard_index=i, busy_seconds=busy)
        store.put(
            f"{keys.shard_prefix('team-a', 'uid-1', i)}/progress.json",
            progress.model_dump_json().encode(),
        )
    used, cost = asyncio.run(gpu_time_charge(store, "team-a", "uid-1", status, None, "3.6"))
    assert used == 4  # (1.2 + 0.4) x 2 GPUs = 3.2, rounded up once
    assert cost == "0.004000"  # 4 GPU-seconds at $3.60 an hour
