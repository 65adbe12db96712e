"""ReadCache: concurrent reads of one object share one API call; optional TTL; errors shared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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


def test_stale_entries_are_answered_while_refreshing() -> None:
    async def run() -> None:
        kube = SlowKube()
        cache = ReadCache(kube, ttl_seconds=0.01)  # type: ignore[arg-type]
        assert await cache.get("batches", "ns", "b") == {"v": 1}
        kube.value = {"v": 2}
        await asyncio.sleep(0.02)  # past the TTL
        started = asyncio.get_running_loop().time()
        assert await cache.get("batches", "ns", "b") == {"v": 1}  # stale, at once
        assert asyncio.get_running_loop().time() - started < 0.04
        await asyncio.sleep(0.1)  # the background refresh landed
        assert await cache.get("batches", "ns", "b") == {"v": 2}
        assert kube.calls == 2

    asyncio.run(run())
