"""The node agent's kubelet endpoint: serves ``/containerLogs/{ns}/{pod}/{container}`` so that
``kubectl logs`` works through the apiserver (TLS with the cluster CA's ``kubelet`` certificate)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

# (namespace, pod) -> the pod's directory under the agent's pods dir, or None.
PodDirLookup = Callable[[str, str], Path | None]
# (namespace, pod) -> is the pod still running (follow stops when it is not).
PodRunning = Callable[[str, str], bool]


def _tail(data: bytes, lines: int) -> bytes:
    if lines < 0:
        return data
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class LogServer:
    def __init__(self, pod_dir: PodDirLookup, running: PodRunning, cert: Path, key: Path) -> None:
        self.pod_dir = pod_dir
        self.running = running
        self.cert = cert
        self.key = key
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_get("/healthz", self._healthz)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        ns = request.match_info["namespace"]
        pod = request.match_info["pod"]
        container = request.match_info["container"]
        directory = self.pod_dir(ns, pod)
        if directory is None or not (directory / container).is_dir():
            raise web.HTTPNotFound(text=f"no logs for {ns}/{pod}/{container}")
        files = sorted((directory / container).glob("*.log"), key=lambda p: int(p.stem))
        if not files:
            raise web.HTTPNotFound(text=f"container {container} has not started")
        previous = request.query.get("previous") in ("true", "1")
        if previous:
            if len(files) < 2:
                raise web.HTTPBadRequest(
                    text=f"previous terminated container {container} not found"
                )
            path = files[-2]
        else:
            path = files[-1]
        tail_lines = int(request.query.get("tailLines", "-1"))
        limit = int(request.query.get("limitBytes", "0"))
        follow = request.query.get("follow") in ("true", "1") and not previous
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        data = _tail(path.read_bytes(), tail_lines)
        if limit > 0:
            data = data[:limit]
        await response.write(data)
        if follow:
            offset = path.stat().st_size
            while True:
                size = path.stat().st_size
                if size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                    offset = size
                    await response.write(chunk)
                elif not self.running(ns, pod):
                    break
                else:
                    await asyncio.sleep(0.2)
        await response.write_eof()
        return response
