"""A request with media enters the engine only once the slot's heartbeat names it
(``SharedEngine``, ``MediaInFlight``): when the slot is then killed for memory, its last
heartbeat says which requests with media it may have held, and nothing else is blamed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from llmbatch.executor.engines.base import EngineRequest, EngineResult
from llmbatch.executor.engines.simulated import SimulatedEngine
from llmbatch.executor.runner import Outcome
from llmbatch.storage.slotchannel import SlotChannel
from tests.fixtures.pictures import data_url, picture
from tests.unit.test_executor_slot import Rig


class Watching(SimulatedEngine):
    """The simulated engine, noting for every request it gets what the channel's heartbeat
    said of it at that moment: named as media in flight, or not."""

    def __init__(self, channel: SlotChannel) -> None:
        super().__init__({"latency_seconds": 0.05}, ["m"])
        self.channel = channel
        self.seen: dict[str, bool] = {}

    async def handle(self, request: EngineRequest) -> EngineResult:
        beat = self.channel.heartbeat()
        named = {c for r in (beat.shards if beat else []) for c in r.media_in_flight}
        self.seen[request.custom_id] = request.custom_id in named
        return await super().handle(request)


def _row(custom_id: str, *parts: dict[str, Any]) -> bytes:
    content: Any = [{"type": "text", "text": "What is it?"}, *parts] if parts else "Hello"
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    return orjson.dumps(line) + b"\n"


def test_a_request_with_media_is_named_in_a_heartbeat_before_it_enters_the_engine(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path)
    spec = rig.shard("a", 1)
    image = {"type": "image_url", "image_url": {"url": data_url(picture("PNG", 16, 16))}}
    rows = [_row("text-1"), _row("image-1", image), _row("text-2"), _row("image-2", image)]
    rig.store.put(spec.input_key, b"".join(rows))
    # a long heartbeat period: only a request with media makes the slot write one at once
    engine = Watching(rig.channel)

    async def go() -> Outcome:
        await engine.start()
        slot = rig.slot(engine, heartbeat_seconds=30.0, concurrency=1)
        rig.assign(spec)
        return await asyncio.wait_for(slot.run(), 30)

    assert asyncio.run(go()) is Outcome.DONE
    assert engine.seen == {"text-1": False, "image-1": True, "text-2": False, "image-2": True}
    beat = rig.channel.heartbeat()
    assert beat is not None
    assert [r.media_in_flight for r in beat.shards] == [[]]  # they left; the end names none
