"""``python -m llmbatch.executor --slot SOURCE``: a warm pool slot's process.

It loads the model once (writing "starting" heartbeats meanwhile, so the operator knows it is
alive), then runs :class:`~llmbatch.executor.slot.Slot` on its channel in the store until it
has been idle for ``idle_seconds``, is drained, or gets SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import SlotHeartbeat, SlotSpec
from llmbatch.executor.engines import EngineConfigError, create_engine
from llmbatch.executor.exitcodes import ExitCode
from llmbatch.executor.main import (
    ShardFailure,
    close_engine,
    exit_code,
    start_engine,
    stop_on_signals,
)
from llmbatch.executor.slot import ChannelAssignments, Slot, SlotSettings
from llmbatch.storage import open_store
from llmbatch.storage.base import ObjectStore, StoreError
from llmbatch.storage.slotchannel import SlotChannel


class StoreCache:
    """One store client per URI, shared by the shards that use it."""

    def __init__(self, first: tuple[str, ObjectStore]) -> None:
        self._stores: dict[str, ObjectStore] = dict([first])

    def get(self, uri: str) -> ObjectStore:
        if uri not in self._stores:
            self._stores[uri] = open_store(uri)
        return self._stores[uri]

    def for_shard(self, spec: ShardSpec) -> tuple[ObjectStore, ObjectStore]:
        return self.get(spec.store), self.get(spec.input_store_uri)


async def _starting_heartbeats(channel: SlotChannel, spec: SlotSpec, started: float) -> None:
    """While the model loads: renew the leases already granted to this slot."""
    while True:
        seq = int(time.time() * 1000)
        beat = SlotHeartbeat(slot=spec.slot, seq=seq, state="starting", started_at=started)
        # A missed one is fine: the next may get through; a lease lapses only after several.
        with contextlib.suppress(StoreError):
            await asyncio.to_thread(channel.write_heartbeat, beat)
        await asyncio.sleep(spec.heartbeat_seconds)


def process_started_at() -> float:
    """Unix seconds this process started — before the interpreter and the executor's imports,
    which are part of a slot's life — from ``/proc`` (10 ms ticks), else now."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()
    return time.time() - max(0.0, age)


async def execute_slot(spec: SlotSpec) -> ExitCode:
    """Run the slot until idle, drained or stopped; its exit code."""
    started = process_started_at()
    try:
        store = open_store(spec.store)
    except ValueError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, f"bad store URI: {exc}") from exc
    channel = SlotChannel(store, spec.channel_prefix)
    names = list(dict.fromkeys([spec.model.name, *spec.model.aliases]))
    try:
        engine = create_engine(spec.engine, spec.model, names)
    except EngineConfigError as exc:
        raise ShardFailure(ExitCode.BAD_CONFIG, str(exc)) from exc
    try:
        stopped = await start_engine(engine, lambda: _starting_heartbeats(channel, spec, started))
        if stopped:
            raise ShardFailure(ExitCode.PREEMPTED, "stopped before any work started")
        slot = Slot(
            engine,
            ChannelAssignments(channel),
            StoreCache((spec.store, store)).for_shard,
            SlotSettings.of(spec, engine),
            process_started_at=started,
        )
        with stop_on_signals(slot.request_stop):
            outcome = await slot.run()
    finally:
        await close_engine(engine)
    return exit_code(outcome, next((r.message for r in slot.runners if r.message), None))
