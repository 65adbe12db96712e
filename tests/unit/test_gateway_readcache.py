"""ReadCache: concurrent reads of one object share one API call; optional TTL; errors shared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmbatch.gateway import readcache
from llmbatch.gateway.readcache import ReadCache


class SlowKube:
    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.value: dict[str, Any] | None = {"v": 1}

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        await asyncio.sleep(0.05)
        if self.fail:
            raise RuntimeError("api down")
        return self.value


def test_concurrent_reads_share_one_call() -> None:
    async def run() -> None:
        kube = SlowKube()
        cache = ReadCache(kube)  # type: ignore[arg-type]
        results = await asyncio.gather(*[cache.get("batches", "ns", "b") for _ in range(50)])
        assert all(r == {"v": 1} for r in results)
        assert kube.calls == 1
        assert cache.coalesced == 49
        # other keys and later reads are separate calls (no TTL: always fresh)
        await cache.get("batches", "other-ns", "b")
        kube.value = {"v": 2}
        assert await cache.get("batches", "ns", "b") == {"v": 2}
        assert kube.calls == 3

    asyncio.run(run())


def test_errors_reach_every_joined_reader() -> None:
    async def run() -> None:
        kube = SlowKube()
        kube.fail = True
        cache = ReadCache(kube)  # type: ignore[arg-type]
        results = await asyncio.gather(
            *[cache.get("batches", "ns", "b") for _ in range(5)], return_exceptions=True
        )
        assert all(isinstance(r, RuntimeError) for r in results)
        kube.fail = False
        assert await cache.get("batches", "ns", "b") == {"v": 1}

    asyncio.run(run())


@pytest.mark.parametrize("ttl", [0.0, 30.0])
def test_ttl_and_write_through(ttl: float) -> None:
    async def run() -> None:
        kube = SlowKube()
        cache = ReadCache(kube, ttl_seconds=ttl, max_entries=2)  # type: ignore[arg-type]
        await cache.get("batches", "ns", "b")
        await cache.get("batches", "ns", "b")
        assert kube.calls == (1 if ttl else 2)
        cache.put("batches", "ns", "b", {"v": 9})
        expected = {"v": 9} if ttl else {"v": 1}
        assert await cache.get("batches", "ns", "b") == expected
        for name in ("c", "d", "e"):  # bounded
            await cache.get("batches", "ns", name)
        assert len(cache._entries) <= 2

    asyncio.run(run())


def test_a_stale_entry_waits_briefly_for_its_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the TTL a poll gets the refreshed answer when the API server answers within the
    wait (a client polling once after a webhook sees the new status), else the cached one,
    while the refresh goes on and lands for the next poll. The API server's speed is a gate the
    test opens, not a sleep, so the outcome does not depend on the machine's load."""

    async def run() -> None:
        kube = GatedKube()
        cache = ReadCache(kube, ttl_seconds=0.01)  # type: ignore[arg-type]
        kube.gate.set()
        assert await cache.get("batches", "ns", "b") == {"v": 1}
        kube.value = {"v": 2}
        await asyncio.sleep(0.02)  # past the TTL
        monkeypatch.setattr(readcache, "STALE_WAIT_SECONDS", 30.0)
        assert await cache.get("batches", "ns", "b") == {"v": 2}  # the API answered: fresh
        kube.value = {"v": 3}
        kube.gate.clear()  # the API server does not answer
        monkeypatch.setattr(readcache, "STALE_WAIT_SECONDS", 0.02)
        await asyncio.sleep(0.02)
        assert await cache.get("batches", "ns", "b") == {"v": 2}  # cached, after the wait
        assert await cache.get("batches", "ns", "b") == {"v": 2}  # joins the same refresh
        assert kube.calls == 3
        kube.gate.set()
        await asyncio.sleep(0)  # the refresh lands
        while cache._inflight:
            await asyncio.sleep(0.001)
        monkeypatch.setattr(readcache, "STALE_WAIT_SECONDS", 30.0)
        assert await cache.get("batches", "ns", "b") == {"v": 3}

    asyncio.run(run())


class GatedKube:
    """An API server that answers once ``gate`` is open."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.value: dict[str, Any] = {"v": 1}

    async def get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        await self.gate.wait()
        return self.value


def test_a_namespace_that_went_is_read_afresh() -> None:
    """What was read of a deleted namespace is never answered to a later one of its name."""

    async def run() -> None:
        kube = SlowKube()
        cache = ReadCache(kube, ttl_seconds=30)  # type: ignore[arg-type]
        await cache.get("batchfiles", "ns", "f")
        await cache.get("batchfiles", "other", "f")
        cache.forget("ns")
        kube.value = None  # the new namespace has no such file
        assert await cache.get("batchfiles", "ns", "f") is None
        assert await cache.get("batchfiles", "other", "f") == {"v": 1}  # still cached
        assert kube.calls == 3

    asyncio.run(run())
