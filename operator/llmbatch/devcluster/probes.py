"""Readiness probes (``httpGet``, ``tcpSocket`` on 127.0.0.1) with a kubelet's verdict rules."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmbatch.devcluster.containers import Container
from llmbatch.devcluster.podcontext import JSON, ContainerConfigError

# A kubelet probes a not-yet-ready container at the probe's period; this agent polls at most
# this often until Ready so that tests and `helm install --wait` do not idle.
UNREADY_POLL_SECONDS = 1.0


async def run_readiness(c: Container, probe: JSON, changed: Callable[[], None]) -> None:
    """Probe ``c`` until cancelled, setting ``c.probe_ready`` (and calling ``changed``) once
    ``successThreshold`` / ``failureThreshold`` consecutive results agree."""
    period = float(probe.get("periodSeconds") or 10)
    timeout = float(probe.get("timeoutSeconds") or 1)
    need = {
        True: int(probe.get("successThreshold") or 1),
        False: int(probe.get("failureThreshold") or 3),
    }
    streak: tuple[bool, int] = (False, 0)
    await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
    while True:
        ok = await probe_once(c, probe, timeout)
        streak = (ok, streak[1] + 1 if streak[0] == ok else 1)
        if streak[1] >= need[ok] and c.probe_ready != ok:
            c.probe_ready = ok
            changed()
        await asyncio.sleep(period if c.probe_ready else min(period, UNREADY_POLL_SECONDS))


def probe_port(c: Container, port: int | str) -> int:
    """A probe's port: a number or the name of one of the container's ``ports``."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for declared in c.spec.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ContainerConfigError(f"probe port {port!r} is not a named port of {c.name}")


async def probe_once(c: Container, probe: JSON, timeout: float) -> bool:
    """One probe; exec and grpc probes are not run here and count as passing."""
    try:
        if "httpGet" in probe:
            return await _http_get(
                probe["httpGet"], probe_port(c, probe["httpGet"]["port"]), timeout
            )
        if "tcpSocket" in probe:
            port = probe_port(c, probe["tcpSocket"]["port"])
            _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
            writer.close()
            return True
    except (OSError, TimeoutError, ValueError, ContainerConfigError):
        return False
    return True


async def _http_get(action: JSON, port: int, timeout: float) -> bool:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        path = action.get("path") or "/"
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
    parts = line.split()
    return len(parts) >= 2 and 200 <= int(parts[1]) < 400
