"""Toxiproxy (built into .cache/bin by ``make toxiproxy``) and a small client of its HTTP API.

A proxy listens on a loopback port and forwards to an upstream; toxics added to it inject TCP
faults on the connections it carries: ``latency``, ``bandwidth`` (slow bodies), ``reset_peer``
(connection resets), ``timeout`` (data stops; the connection closes after the timeout),
``slow_close``, ``limit_data``. Disabling a proxy refuses every connection (the store is down).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from tests.fixtures.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / ".cache" / "bin" / "toxiproxy-server"


class Toxiproxy:
    """The API of one running toxiproxy-server."""

    def __init__(self, api_url: str) -> None:
        self.api_url = api_url

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def create_proxy(self, name: str, upstream: str) -> str:
        """A proxy to ``upstream`` (host:port); returns the address it listens on."""
        listen = f"127.0.0.1:{free_port()}"
        self._call(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )
        return listen

    def add_toxic(
        self,
        proxy: str,
        kind: str,
        attributes: dict[str, int],
        *,
        stream: str = "downstream",
        toxicity: float = 1.0,
    ) -> str:
        name = f"{kind}-{stream}-{time.monotonic_ns()}"
        self._call(
            "POST",
            f"/proxies/{proxy}/toxics",
            {
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )
        return name

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")


@contextlib.contextmanager
def running_toxiproxy(log_path: pathlib.Path) -> Iterator[Toxiproxy]:
    binary = shutil.which("toxiproxy-server") or str(BINARY)
    if not pathlib.Path(binary).exists():
        raise RuntimeError("toxiproxy-server is not built: run `make toxiproxy`")
    port = free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            env={**os.environ, "LOG_LEVEL": "info"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = Toxiproxy(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client._call("GET", "/version")
                break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"toxiproxy did not start: {log_path.read_text()}") from None
                time.sleep(0.1)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
