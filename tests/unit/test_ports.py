"""Test ports never come from the kernel's ephemeral range (tests/fixtures/ports.py).

The fresh-clone flake of test_devstack ("address already in use" for the dev stack's gateway) was
a probed bind(0) port handed by the kernel to the control plane's own bind(0) etcd probe a moment
later. Ports below ``ip_local_port_range`` are never handed out that way: this pins the property.
"""

from __future__ import annotations

import pathlib
import socket

from tests.fixtures.ports import free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    start = int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(50):
        port = free_port()
        assert 10000 <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_an_ephemeral_probe_never_returns_one_of_them() -> None:
    chosen = {free_port() for _ in range(20)}
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            assert sock.getsockname()[1] not in chosen
