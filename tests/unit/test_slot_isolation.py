"""Shared slots, isolated failures: one shard's store error, lost lease or poison request stays
that shard's; the slot and every other run on it go on (#31).

Two shards share one slot; faults are injected into one of them only (its store keys, its
lease, a request of its that crashes the engine) and the other must complete with exact lines
and nothing charged to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmbatch.api.slot import SlotHeartbeat
from llmbatch.executor.engines.base import EngineDead, EngineRequest
from llmbatch.executor.engines.simulated import SimulatedEngine
from llmbatch.executor.runner import Outcome
from llmbatch.executor.sharedengine import EngineGate
from llmbatch.executor.slot import ChannelAssignments, Slot, SlotSettings
from llmbatch.storage import FilesystemStore
from llmbatch.storage.base import ObjectInfo, StoreError, Versioned
from llmbatch.storage.shardresults import read_progress
from tests.unit.test_executor_slot import Rig, _engine, _started, _until

Predicate = Callable[[str, str], bool]
"""(operation, key) -> whether the call fails."""


class FaultyStore(FilesystemStore):
    """The filesystem store with failures injected into the calls ``fails`` picks."""

    def __init__(self, root: Path, fails: Predicate) -> None:
        super().__init__(root)
        self.fails = fails
        self.injected = 0

    def _maybe(self, op: str, key: str) -> None:
        if self.fails(op, key):
            self.injected += 1
            raise StoreError(f"injected: 503 SlowDown on {op} {key}")

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        self._maybe("get", key)
        return super().get(key, start, end)

    def get_versioned(self, key: str) -> Versioned:
        self._maybe("get", key)
        return super().get_versioned(key)

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        self._maybe("read", key)
        return super().iter_range(key, start, end, chunk_size)

    def put(
        self, key: str, data: Any, *, if_absent: bool = False, sha256: Any = None
    ) -> ObjectInfo:
        self._maybe("put", key)
        return super().put(key, data, if_absent=if_absent, sha256=sha256)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        self._maybe("put", key)
        return super().put_if_match(key, data, version)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._maybe("list", prefix)
        return super().list(prefix)

    def atomic_if_absent(self) -> bool:
        self._maybe("probe", "")
        return True


class SharedRig(Rig):
    """Two shards of two tenants on one slot; the victim's store calls go through ``faulty``."""

    def __init__(self, root: Path, fails: Predicate) -> None:
        super().__init__(root)
        self.faulty = FaultyStore(root, fails)
        self.victim = self.shard("victim", 30, store_retry_seconds=0.5, max_in_flight=2)
        self.bystander = self.shard("bystander", 30, max_in_flight=2)

    def stores(self, spec: Any) -> tuple[Any, Any]:
        store = self.faulty if spec.batch_uid == "victim" else self.store
        return store, store

    def slot(self, engine: SimulatedEngine, **settings: Any) -> Slot:
        pace: dict[str, Any] = {"poll_seconds": 0.05, "heartbeat_seconds": 0.05}
        return Slot(
            engine,
            ChannelAssignments(self.channel),
            self.stores,
            SlotSettings(name="slot-0", concurrency=2, **(pace | settings)),
        )

    def report(self, uid: str) -> Any:
        beat = self.channel.heartbeat()
        assert isinstance(beat, SlotHeartbeat)
        return next(r for r in beat.shards if r.key.startswith(uid))


def _victim(op: str, key_part: str = "victim") -> Predicate:
    return lambda o, key: o == op and key_part in key


def _exact(rig: Rig, spec: Any, requests: int) -> None:
    ids = rig.done_ids(spec)
    assert sorted(ids) == sorted(f"{spec.batch_uid}-r{i}" for i in range(requests))


def _run_slot(rig: SharedRig, **settings: Any) -> Outcome:
    async def go() -> Outcome:
        engine = await _started(_engine(latency_seconds=0.01))
        slot = rig.slot(engine, **settings)
        rig.assign(rig.victim)
        rig.assign(rig.bystander)
        return await asyncio.wait_for(slot.run(), 30)

    return asyncio.run(go())


def test_a_shards_input_read_failing_once_costs_it_a_pause_not_the_slot(tmp_path: Path) -> None:
    """Reproduced in #31: the victim's first input read answers 503 once; before, the slot
    process ended and the bystander stopped part-way. Now the read is retried where it
    stopped: both shards complete, each line once."""
    failed: list[str] = []

    def once(op: str, key: str) -> bool:
        if op == "read" and "victim" in key and not failed:
            failed.append(key)
            return True
        return False

    rig = SharedRig(tmp_path, once)
    assert _run_slot(rig) is Outcome.DONE
    assert failed
    _exact(rig, rig.bystander, 30)
    _exact(rig, rig.victim, 30)
    assert rig.report("victim").state == "done"


@pytest.mark.parametrize(
    ("fails", "what"),
    [
        (_victim("read"), "its input range"),
        (_victim("list"), "its committed chunks (recover)"),
        (_victim("get", "lease.json"), "its lease"),
        (_victim("put", "progress.json"), "its progress record"),
        (lambda op, key: op == "probe", "the S3 capability probe"),
        (_victim("put", "output-"), "its result chunks"),
    ],
)
def test_a_shard_whose_store_stays_down_fails_alone(
    tmp_path: Path, fails: Predicate, what: str
) -> None:
    """Every store call of one run failing for longer than its retry window ends that run
    STORE_FAILED (one attempt for its shard); the slot and the other tenant's shard go on."""
    rig = SharedRig(tmp_path, fails)
    assert _run_slot(rig) is Outcome.DONE, what  # the slot ran to its idle end
    assert rig.faulty.injected > 0, what
    victim = rig.report("victim")
    assert victim.state == "store_failed", what
    assert victim.counts_attempt
    _exact(rig, rig.bystander, 30)
    assert rig.report("bystander").state == "done"


def test_an_unusable_store_uri_fails_that_shard_only(tmp_path: Path) -> None:
    rig = SharedRig(tmp_path, lambda op, key: False)

    def stores(spec: Any) -> tuple[Any, Any]:
        if spec.batch_uid == "victim":
            raise ValueError("bad store URI: nope://")
        return rig.store, rig.store

    rig.stores = stores  # type: ignore[method-assign]
    assert _run_slot(rig) is Outcome.DONE
    assert rig.report("victim").state == "store_failed"
    _exact(rig, rig.bystander, 30)


# --- poison requests ----------------------------------------------------------------------------


def _crash_rig(tmp_path: Path) -> SharedRig:
    rig = SharedRig(tmp_path, lambda op, key: False)
    rig.victim = rig.shard("victim", 12, max_in_flight=4)
    rig.bystander = rig.shard("bystander", 40, max_in_flight=4)
    return rig


class _CrashesWithBystanderInside(SimulatedEngine):
    """The poison request crashes the engine at a moment a bystander request is inside with
    it: what the first life's crash must find, whatever a loaded machine does to the timing
    (the bystander's feed can wait on its input or its commits with nothing in the engine, and
    what was inside can finish during the poison request's own latency)."""

    def __init__(self, args: dict[str, Any], served: list[str]) -> None:
        super().__init__(args, served)
        self.bystanders_inside = 0

    async def handle(self, request: EngineRequest) -> Any:
        if request.custom_id.startswith("bystander"):
            # Counted while it cannot finish before a crash it overlaps: once the engine has
            # died, the simulated engine refuses it (a request whose latency ran out in the
            # very tick of the crash would otherwise complete, and nothing be inside).
            self.bystanders_inside += 1
            try:
                await asyncio.sleep(self.args.latency_seconds)
            finally:
                self.bystanders_inside -= 1
            return await super().handle(request)
        if request.custom_id == "victim-r5":
            await asyncio.sleep(self.args.latency_seconds)
            await _until(lambda: self.bystanders_inside > 0, timeout=20)
            self._die("simulated engine crash on request victim-r5")  # no await since the check
            raise EngineDead("simulated engine crash on request victim-r5")
        return await super().handle(request)


async def _one_slot_life(rig: SharedRig, first: bool) -> Outcome:
    """A slot with a fresh engine (the last one crashed) over the same channel. The first
    time, the victim's shard is assigned once the bystander's requests stream through the
    engine, and the crash waits for one of them inside."""
    args = {"latency_seconds": 0.05, "crash_pattern": r"^victim-r5$"}
    kind = _CrashesWithBystanderInside if first else SimulatedEngine
    engine = await _started(kind(args, ["m"]))
    slot = rig.slot(engine, idle_seconds=0)
    if not first:
        return await asyncio.wait_for(slot.run(), 30)
    rig.assign(rig.bystander)
    task = asyncio.ensure_future(slot.run())
    await _until(lambda: any(r.stats.completed >= 2 for r in slot.runners))
    rig.assign(rig.victim, when=1.0)
    return await asyncio.wait_for(task, 30)


class _SlowToNotice(_CrashesWithBystanderInside):
    """Once the engine is dead, the bystander's requests never come back (a connection that
    hangs instead of failing): only the slot can tell that run its engine broke. The crash
    waits for a bystander request inside: with none inside (its feed waiting on its input or
    its commits on a loaded machine) the run rightly has no suspects."""

    async def handle(self, request: EngineRequest) -> Any:
        try:
            return await super().handle(request)
        except EngineDead:
            if request.custom_id.startswith("bystander"):
                await asyncio.Event().wait()
            raise


def test_a_run_that_has_not_seen_the_crash_itself_ends_engine_failed_not_preempted(
    tmp_path: Path,
) -> None:
    """The interleaving behind a flake of the test below, forced: the victim's run ends
    ENGINE_FAILED before the bystander's requests notice the dead engine. The slot then ends the
    bystander's run as an engine failure too, with what it had inside as suspects — before, it
    asked it to stop, and a stop wins: 'preempted', no crash recorded for its requests (a
    poison request among them would have crashed engines without bound)."""
    rig = _crash_rig(tmp_path)

    async def go() -> Outcome:
        engine = _SlowToNotice({"latency_seconds": 0.05, "crash_pattern": r"^victim-r5$"}, ["m"])
        await engine.start()
        slot = rig.slot(engine, idle_seconds=0)
        rig.assign(rig.bystander)
        task = asyncio.ensure_future(slot.run())
        await _until(lambda: any(r.stats.completed >= 2 for r in slot.runners))
        rig.assign(rig.victim, when=1.0)
        return await asyncio.wait_for(task, 10)

    assert asyncio.run(go()) is Outcome.ENGINE_FAILED
    bystander = rig.report("bystander")
    assert bystander.state == "engine_failed", bystander
    assert not bystander.counts_attempt
    assert bystander.crash_suspects > 0  # its requests inside are isolated on the next run


def test_a_request_that_crashes_the_engine_fails_alone_and_costs_nobody_an_attempt(
    tmp_path: Path,
) -> None:
    """Crash 1: the poison request and what else was in the engine become suspects, and no run
    counts an attempt. Next life: suspects run alone; the poison one crashes the engine alone.
    Next: it is an error line, everything else is answered once."""
    rig = _crash_rig(tmp_path)

    async def go() -> None:
        assert await _one_slot_life(rig, first=True) is Outcome.ENGINE_FAILED
        for uid in ("victim", "bystander"):
            report = rig.report(uid)
            assert report.state == "engine_failed", uid
            assert not report.counts_attempt, uid
        suspects = orjson.loads(rig.store.get(rig.victim.output_prefix + "/suspects.json"))
        assert suspects["crashes"]["victim-r5"] == 1
        assert await _one_slot_life(rig, first=False) is Outcome.ENGINE_FAILED
        assert not rig.report("victim").counts_attempt
        bystander = rig.report("bystander")  # done, or had nothing inside: not charged
        assert bystander.state == "done" or not bystander.counts_attempt
        assert bystander.crash_suspects == 0
        assert await _one_slot_life(rig, first=False) is Outcome.DONE

    asyncio.run(go())
    _exact(rig, rig.bystander, 40)
    ids = rig.done_ids(rig.victim)
    assert sorted(ids) == sorted(f"victim-r{i}" for i in range(12))  # each once
    errors = [
        orjson.loads(raw)
        for key in rig.store.list(rig.victim.output_prefix + "/errors-")
        for raw in rig.store.get(key.key).splitlines()
    ]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("victim-r5", 500)]
    assert errors[0]["response"]["body"]["error"]["code"] == "request_crashed_engine"
    suspects = orjson.loads(rig.store.get(rig.victim.output_prefix + "/suspects.json"))
    assert suspects["crashes"]["victim-r5"] == 2
    # the bystander's suspects of the first crash were in the engine at one crash only
    bystander = orjson.loads(rig.store.get(rig.bystander.output_prefix + "/suspects.json"))
    assert set(bystander["crashes"].values()) == {1}
    progress = read_progress(rig.store, rig.bystander.output_prefix)
    assert progress is not None
    assert progress.done


def test_the_gate_lets_an_isolated_request_in_alone() -> None:
    """An isolated request waits until the engine is empty, and nothing enters beside it."""
    gate = EngineGate()
    inside: list[str] = []
    most_beside_isolated = 0

    async def request(name: str, alone: bool, hold: float) -> None:
        nonlocal most_beside_isolated
        async with gate.enter(alone):
            inside.append(name)
            if "iso" in inside:
                most_beside_isolated = max(most_beside_isolated, len(inside) - 1)
            await asyncio.sleep(hold)
            inside.remove(name)

    async def go() -> None:
        first = [asyncio.ensure_future(request(f"n{i}", False, 0.1)) for i in range(3)]
        await asyncio.sleep(0.01)
        iso = asyncio.ensure_future(request("iso", True, 0.1))
        await asyncio.sleep(0.01)
        later = [asyncio.ensure_future(request(f"m{i}", False, 0.05)) for i in range(3)]
        await asyncio.gather(*first, iso, *later)

    asyncio.run(go())
    assert most_beside_isolated == 0


def test_an_isolated_request_is_marked_so(tmp_path: Path) -> None:
    """A suspect of an earlier crash reaches the engine as ``isolated``; others do not."""
    rig = Rig(tmp_path)
    spec = rig.shard("a", 3)
    rig.store.put(
        spec.output_prefix + "/suspects.json", orjson.dumps({"version": 1, "crashes": {"a-r1": 1}})
    )
    seen: dict[str, bool] = {}

    class Recording(SimulatedEngine):
        async def handle(self, request: EngineRequest) -> Any:
            seen[request.custom_id] = request.isolated
            return await super().handle(request)

    async def go() -> None:
        engine = Recording({}, ["m"])
        await engine.start()
        slot = rig.slot(engine)
        rig.assign(spec)
        assert await asyncio.wait_for(slot.run(), 10) is Outcome.DONE

    asyncio.run(go())
    assert seen == {"a-r0": False, "a-r1": True, "a-r2": False}


def test_a_tenants_salt_replaces_any_salt_a_request_line_brings(tmp_path: Path) -> None:
    """Tenants sharing an engine never share cached prefixes: the shard's salt (the tenant's)
    goes on every generative request, whatever salt the line itself names."""
    from llmbatch.core.ids import tenant_cache_salt
    from llmbatch.executor.shardinput import parse_line

    rig = Rig(tmp_path)
    salt = tenant_cache_salt("team-a")
    assert salt != tenant_cache_salt("team-b")
    spec = rig.shard("a", 1, cache_salt=salt)
    line = orjson.dumps(
        {
            "custom_id": "x",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [], "cache_salt": tenant_cache_salt("team-b")},
        }
    )
    assert parse_line(spec, 1, line).body["cache_salt"] == salt
    plain = orjson.dumps(
        {"custom_id": "y", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
    )
    assert "cache_salt" not in parse_line(rig.shard("b", 1), 1, plain).body  # a local run


def test_requests_cancelled_at_the_gate_or_inside_it_never_hold_the_door() -> None:
    """Found by the blast-radius sweep: a request cancelled while it left the gate (a shard
    taken back during a drain) could stay counted inside; every later request then waited at
    the door for ever and the shard never ended. Whatever is cancelled where, the gate ends
    idle and lets the next request in."""
    gate = EngineGate()

    async def hold(alone: bool, seconds: float) -> None:
        async with gate.enter(alone):
            await asyncio.sleep(seconds)

    async def go() -> None:
        inside = [asyncio.ensure_future(hold(False, 10)) for _ in range(3)]
        await asyncio.sleep(0.01)
        isolated = asyncio.ensure_future(hold(True, 10))  # waits for the engine to empty
        await asyncio.sleep(0.01)
        blocked = asyncio.ensure_future(hold(False, 0))  # waits behind the isolated one
        await asyncio.sleep(0.01)
        for task in [*inside, isolated]:
            task.cancel()
        await asyncio.gather(*inside, isolated, return_exceptions=True)
        await asyncio.wait_for(blocked, 1)  # the door is open again
        assert gate.idle

    asyncio.run(go())
