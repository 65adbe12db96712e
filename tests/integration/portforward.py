"""``kubectl port-forward`` for the dev cluster, whose node agent cannot forward (its pods are
local processes that all listen on 127.0.0.1).

``python portforward.py -n NAMESPACE port-forward svc/NAME LOCAL:PORT`` resolves the Service the
way kube-proxy would — its port ``PORT``, that port's ``targetPort`` (a number or a container
port name), a Running pod its selector matches — and relays 127.0.0.1:LOCAL to the pod's port on
127.0.0.1. A wrong Service name or port fails like kubectl does, which is what the docs test
needs: the command in docs/install.md runs as written.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any


def _kubectl_json(*args: str) -> Any:
    result = subprocess.run(
        ["kubectl", *args, "-o", "json"], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise SystemExit(result.stderr.strip() or f"kubectl {' '.join(args)} failed")
    return json.loads(result.stdout)


def resolve(namespace: str, target: str, service_port: int) -> int:
    """The loopback port that serves ``target``'s ``service_port``."""
    kind, _, name = target.partition("/")
    if kind not in ("svc", "service", "services"):
        raise SystemExit(f"portforward: only svc/NAME targets are emulated, got {target}")
    service = _kubectl_json("-n", namespace, "get", "service", name)
    ports = [p for p in service["spec"]["ports"] if p["port"] == service_port]
    if not ports:
        raise SystemExit(f"error: Service {name} does not have a service port {service_port}")
    target_port = ports[0].get("targetPort", service_port)
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    pods = _kubectl_json("-n", namespace, "get", "pods", "-l", selector)["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    if not running:
        raise SystemExit(f"error: no running pod for Service {name}")
    if isinstance(target_port, int):
        return target_port
    for container in running[0]["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == target_port:
                return int(port["containerPort"])
    raise SystemExit(f"error: no container port named {target_port} in Service {name}'s pods")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def serve(local: int, remote: int) -> None:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", remote)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(relay, "127.0.0.1", local)
    print(f"Forwarding from 127.0.0.1:{local} -> {remote}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    args = list(argv)
    namespace = "default"
    for flag in ("-n", "--namespace"):
        if flag in args:
            index = args.index(flag)
            namespace = args[index + 1]
            del args[index : index + 2]
    if not args or args[0] != "port-forward" or len(args) != 3:
        raise SystemExit(f"portforward: unsupported arguments {argv}")
    local, _, remote = args[2].partition(":")
    port = resolve(namespace, args[1], int(remote or local))
    asyncio.run(serve(int(local), port))


if __name__ == "__main__":
    main(sys.argv[1:])
