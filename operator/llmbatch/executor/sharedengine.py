"""A slot's one engine as the shards on it share it: who is inside, busy time, isolation.

Several shards — often several tenants' — run on one engine at once. Each sees it through a
:class:`SharedEngine`: its requests are timed in the slot's :class:`BusyLedger` (GPU-time
billing: each answer carries its own share), counted as inside while the engine has them (what
an engine crash is laid at), and pass the slot's :class:`EngineGate`, which lets a request that
was inside at an earlier crash in only when nothing else is, so a second crash is laid at its
door alone. A request with media enters only once a heartbeat names it (:class:`MediaInFlight`):
what an out-of-memory kill of the whole slot is laid at.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable

from llmbatch.executor.engines.base import Engine, EngineDead, EngineRequest, EngineResult


class BusyLedger:
    """The slot's busy time, each shard's share of it, and each request's.

    Busy means at least one request is in the engine. While ``n`` requests are in it, each
    accrues ``1/n`` of the time, so the shares add up to the busy time exactly: GPU-time
    billing charges a batch the shares of its requests whose results were committed, never a
    warm slot's idle time. A request's share is the growth, while it was inside, of one
    running sum of ``elapsed / n`` (O(1) per request, whatever is in the engine); a shard's
    is kept per key for the heartbeat.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.busy = 0.0
        self.per_request = 0.0
        """The time one request inside the engine all along would have accrued so far."""
        self._in_engine: dict[str, int] = {}
        self._shares: dict[str, float] = {}
        self._last = clock()

    def _settle(self) -> None:
        now = self.clock()
        elapsed, self._last = now - self._last, now
        total = sum(self._in_engine.values())
        if total:
            self.busy += elapsed
            self.per_request += elapsed / total
            for key, count in self._in_engine.items():
                self._shares[key] = self._shares.get(key, 0.0) + elapsed * count / total

    def enter(self, key: str) -> float:
        """A request of ``key`` entered; the token to give :meth:`leave`."""
        self._settle()
        self._in_engine[key] = self._in_engine.get(key, 0) + 1
        return self.per_request

    def leave(self, key: str, token: float | None = None) -> float:
        """A request of ``key`` left; its share of the busy time (given its :meth:`enter`
        token)."""
        self._settle()
        self._in_engine[key] -= 1
        if not self._in_engine[key]:
            del self._in_engine[key]
        return 0.0 if token is None else self.per_request - token

    def share(self, key: str) -> float:
        self._settle()
        return self._shares.get(key, 0.0)

    def busy_seconds(self) -> float:
        self._settle()
        return self.busy

    def in_engine(self) -> int:
        return sum(self._in_engine.values())


class EngineGate:
    """Requests enter the engine together, but an isolated one alone: it waits until the
    engine is empty, and while it waits or runs nothing else enters (so the engine empties).

    Leaving never waits for anything (the counts change at once, waiters are woken): a request
    cancelled on its way out — a shard taken back, an engine that died — cannot leave the gate
    counting it inside for ever, which would hold every later request at the door.
    """

    def __init__(self) -> None:
        self._inside = 0
        self._alone = False
        self._waiting_alone = 0
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():  # checked and claimed with no await in between
            await self._changed.wait()

    @contextlib.asynccontextmanager
    async def enter(self, alone: bool) -> AsyncIterator[None]:
        if alone:
            self._waiting_alone += 1
            try:
                await self._until(lambda: self._inside == 0 and not self._alone)
            finally:
                self._waiting_alone -= 1
                self._notify()
            self._alone = True
        else:
            await self._until(lambda: not self._alone and not self._waiting_alone)
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1
            if alone:
                self._alone = False
            self._notify()

    @property
    def idle(self) -> bool:
        """Nothing inside and nobody waiting to be alone."""
        return self._inside == 0 and not self._alone and not self._waiting_alone


class MediaInFlight:
    """The slot's requests with media in the engine, each named in a heartbeat before it
    enters: a slot killed for memory has its last heartbeat say which requests with media it
    held (a superset: named ones may have just left), so the operator blames only those.

    A request waits at the door until a heartbeat written after it was named has landed;
    ``on_named`` asks the slot to write one now (requests named meanwhile share it).
    """

    def __init__(self, on_named: Callable[[], None] = lambda: None) -> None:
        self.on_named = on_named
        self._named: dict[str, set[str]] = {}
        self._seq = 0
        """Names given so far."""
        self._recorded = 0
        """Names a written heartbeat covers."""
        self._changed = asyncio.Event()

    @contextlib.asynccontextmanager
    async def inside(self, key: str, custom_id: str) -> AsyncIterator[None]:
        """Name the request of run ``key``, wait for a heartbeat naming it, and keep it named
        while it is inside."""
        self._named.setdefault(key, set()).add(custom_id)
        self._seq += 1
        mine = self._seq
        try:
            if self._recorded < mine:
                self.on_named()
            while self._recorded < mine:
                await self._changed.wait()
            yield
        finally:
            named = self._named.get(key)
            if named is not None:
                named.discard(custom_id)
                if not named:
                    del self._named[key]

    def snapshot(self) -> int:
        """The names given so far: pass it to :meth:`recorded` once the heartbeat that reads
        :meth:`named` now is written."""
        return self._seq

    def named(self, key: str) -> list[str]:
        """The requests of run ``key`` named now."""
        return sorted(self._named.get(key, ()))

    def recorded(self, seq: int) -> None:
        """A heartbeat naming everything named up to ``seq`` was written: they may enter."""
        if seq > self._recorded:
            self._recorded = seq
            self._changed.set()
            self._changed = asyncio.Event()

    @property
    def waiting(self) -> bool:
        """Some request waits for a heartbeat to name it."""
        return self._recorded < self._seq


class SharedEngine(Engine):
    """The slot's engine as one shard run sees it.

    Its requests are held back until ``on_record`` is set (a heartbeat has reported the run
    started), pass the slot's gate, and are timed in the shared ledger while inside.
    """

    def __init__(
        self,
        engine: Engine,
        ledger: BusyLedger,
        gate: EngineGate,
        key: str,
        on_record: asyncio.Event,
        media: MediaInFlight | None = None,
    ) -> None:
        self.inner = engine
        self.ledger = ledger
        self.gate = gate
        self.key = key
        self.on_record = on_record
        self.media = media
        """Where requests with media are named before they enter; None: not named (no slot
        heartbeat to name them in)."""
        self.name = engine.name
        self._inside: set[str] = set()

    @property
    def max_num_seqs(self) -> int:
        return self.inner.max_num_seqs

    async def start(self) -> None:
        await self.inner.start()

    async def handle(self, request: EngineRequest) -> EngineResult:
        await self.on_record.wait()
        named = None
        if request.media and self.media is not None:
            named = self.media.inside(self.key, request.custom_id)
        async with self.gate.enter(alone=request.isolated), named or contextlib.nullcontext():
            dead = self.inner.dead_reason()
            if dead is not None:  # it died while this one waited: it was never inside
                raise EngineDead(dead)
            token = self.ledger.enter(self.key)
            share = 0.0
            self._inside.add(request.custom_id)
            try:
                result = await self.inner.handle(request)
            except BaseException:
                if self.inner.dead_reason() is None:
                    self._inside.discard(request.custom_id)
                raise  # in the engine when it died: still counted inside (a suspect)
            finally:
                share = self.ledger.leave(self.key, token)
            self._inside.discard(request.custom_id)
            return dataclasses.replace(result, busy_seconds=share)

    def inside(self) -> set[str]:
        """The custom_ids of this run in the engine now (not those waiting at the gate), and
        those that were in it when it died."""
        return set(self._inside)

    def dead_reason(self) -> str | None:
        return self.inner.dead_reason()

    async def close(self) -> None:
        return None  # the slot closes the shared engine
