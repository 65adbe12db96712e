"""Remote media fetched by the executor itself, through the webhooks' address guard
(``executor.mediafetch``, ``executor.mediagate``), against real local servers.

A URL whose host is, or resolves to, a loopback or private address is refused before any
connection: a listener there receives nothing, not even a TCP connect. A redirect is followed by
hand and each hop checked again: a public (here: an allowed) server redirecting to a refused
address gets nothing from it. What is fetched reaches the engine as a ``data:`` URL (the engine
never fetches), within the size and pixel caps.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from llmbatch.api.shard import MediaLimits, RemoteMedia
from llmbatch.executor.engines.base import Engine, EngineRequest, EngineResult
from llmbatch.executor.mediafetch import Fetchers
from llmbatch.executor.mediagate import MediaGate
from tests.fixtures.pictures import picture, png_bomb
from tests.fixtures.webhooks import ScriptedDNS

CHAT = "/v1/chat/completions"
PNG = picture("PNG", 20, 10)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Listener:
    """A TCP server that records every connection made to it and answers nothing."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self, host: str) -> int:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            writer.close()

        self.server = await asyncio.start_server(accepted, host, 0)
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@asynccontextmanager
async def http(handler: Handler, host: str = "127.0.0.1") -> AsyncIterator[tuple[int, list[str]]]:
    """An HTTP server on ``host`` answering every path with ``handler``: (port, paths asked)."""
    asked: list[str] = []

    async def record(request: web.Request) -> web.StreamResponse:
        asked.append(request.path)
        return await handler(request)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield runner.addresses[0][1], asked
    finally:
        await runner.cleanup()


class Recorder(Engine):
    """An engine that records the requests it gets and answers 200."""

    name = "recorder"

    def __init__(self) -> None:
        self.got: list[EngineRequest] = []

    @property
    def max_num_seqs(self) -> int:
        return 4

    async def start(self) -> None:
        return None

    async def handle(self, request: EngineRequest) -> EngineResult:
        self.got.append(request)
        return EngineResult(200, {"ok": True})

    def dead_reason(self) -> str | None:
        return None

    async def close(self) -> None:
        return None


def _request(url: str) -> EngineRequest:
    part = {"type": "image_url", "image_url": {"url": url}}
    content = [{"type": "text", "text": "What is it?"}, part]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    return EngineRequest(custom_id="r1", url=CHAT, body=body, request_id="req_1")


async def _through_gate(
    url: str, remote: RemoteMedia | None, max_pixels: int = 1 << 24
) -> tuple[EngineResult, Recorder]:
    engine, fetchers = Recorder(), Fetchers()
    limits = MediaLimits(max_image_pixels=max_pixels, remote=remote)
    try:
        result = await MediaGate(engine, limits, fetchers).handle(_request(url))
    finally:
        await fetchers.close()
    return result, engine


def _code(result: EngineResult) -> Any:
    return result.body.get("error", {}).get("code")


LOOPBACK_ALLOWED = RemoteMedia(allowed_networks=["127.0.0.1/32"], timeout_seconds=5)


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "media.example.test", "[::ffff:7f00:1]"]
)
def test_a_url_that_is_or_resolves_to_loopback_is_refused_and_the_listener_gets_nothing(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ScriptedDNS(monkeypatch, {"media.example.test": [["127.0.0.1"]], "localhost": [["127.0.0.1"]]})

    async def scenario() -> tuple[EngineResult, Recorder, int]:
        listener = Listener()
        port = await listener.start("127.0.0.1")
        try:
            result, engine = await _through_gate(f"http://{host}:{port}/cat.png", RemoteMedia())
        finally:
            listener.close()
        return result, engine, listener.connections

    result, engine, connections = asyncio.run(scenario())
    assert (result.status_code, _code(result)) == (400, "remote_media_refused")
    assert "loopback" in result.body["error"]["message"]
    assert result.body["error"]["param"] == "body.messages[0].content[1].image_url.url"
    assert connections == 0
    assert engine.got == []


def test_a_redirect_hop_to_a_refused_address_is_refused_and_that_listener_gets_nothing() -> None:
    async def scenario() -> tuple[EngineResult, list[str], int]:
        listener = Listener()
        inner_port = await listener.start("127.0.0.2")  # loopback, not in the allowed /32

        async def redirect(_: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(f"http://127.0.0.2:{inner_port}/secret")

        try:
            async with http(redirect) as (port, asked):
                url = f"http://127.0.0.1:{port}/cat.png"
                result, _ = await _through_gate(url, LOOPBACK_ALLOWED)
        finally:
            listener.close()
        return result, asked, listener.connections

    result, asked, connections = asyncio.run(scenario())
    assert asked == ["/cat.png"]  # the allowed server was asked once
    assert (result.status_code, _code(result)) == (400, "remote_media_refused")
    assert "127.0.0.2 is not public (loopback)" in result.body["error"]["message"]
    assert connections == 0


def test_a_fetched_image_reaches_the_engine_as_a_data_url_after_an_allowed_redirect() -> None:
    async def scenario() -> tuple[EngineResult, Recorder, list[str]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            if request.path == "/start":
                raise web.HTTPFound("/cat")
            return web.Response(body=PNG, content_type="application/octet-stream")

        async with http(serve) as (port, asked):
            result, engine = await _through_gate(f"http://127.0.0.1:{port}/start", LOOPBACK_ALLOWED)
        return result, engine, asked

    result, engine, asked = asyncio.run(scenario())
    assert result.status_code == 200
    assert asked == ["/start", "/cat"]
    (sent,) = engine.got
    assert sent.media
    url = sent.body["messages"][0]["content"][1]["image_url"]["url"]
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert "127.0.0.1" not in json.dumps(sent.body)


@pytest.mark.parametrize(
    ("body", "settings", "code"),
    [
        (
            bytes(4096),
            LOOPBACK_ALLOWED.model_copy(update={"max_bytes": 1000}),
            "remote_media_too_large",
        ),
        (png_bomb(), LOOPBACK_ALLOWED, "image_too_large"),
        (b"not an image", LOOPBACK_ALLOWED, "invalid_media"),
    ],
)
def test_what_is_fetched_is_capped_like_inline_media(
    body: bytes, settings: RemoteMedia, code: str
) -> None:
    async def scenario() -> tuple[EngineResult, Recorder]:
        async def serve(_: web.Request) -> web.StreamResponse:
            return web.Response(body=body)

        async with http(serve) as (port, _):
            return await _through_gate(f"http://127.0.0.1:{port}/x", settings)

    result, engine = asyncio.run(scenario())
    assert (result.status_code, _code(result)) == (400, code)
    assert engine.got == []


def test_redirects_beyond_the_limit_and_remote_urls_where_remote_media_is_off_are_refused() -> None:
    async def scenario() -> tuple[EngineResult, EngineResult, list[str]]:
        async def loop(request: web.Request) -> web.StreamResponse:
            raise web.HTTPFound(f"/{len(request.path)}")

        async with http(loop) as (port, asked):
            url = f"http://127.0.0.1:{port}/a"
            looped, _ = await _through_gate(url, LOOPBACK_ALLOWED)
            off, _ = await _through_gate(url, None)
        return looped, off, asked

    looped, off, asked = asyncio.run(scenario())
    assert _code(looped) == "remote_media_refused"
    assert "more than 3 redirects" in looped.body["error"]["message"]
    assert len(asked) == 4
    assert _code(off) == "remote_media_not_allowed"
