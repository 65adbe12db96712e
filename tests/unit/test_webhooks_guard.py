"""The address guard and the sender of webhook deliveries, against a real local HTTP server.

Loopback is refused by default; the tests allow it explicitly, as the operator's configuration
(``LLMBATCH_WEBHOOK_ALLOWED_NETWORKS``) would.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from llmbatch.controller.webhooks import (
    GuardedResolver,
    GuardedSockets,
    Refused,
    Sender,
    check_host,
    refusals,
)
from llmbatch.core.netguard import ipv4_number, parse_networks, refusal, url_problem

LOOPBACK = parse_networks("127.0.0.0/8,::1/128")


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.5.5.5",
        "::1",
        "10.0.0.1",
        "172.16.3.4",
        "192.168.1.1",
        "100.64.0.1",  # shared address space (carrier NAT)
        "169.254.1.1",
        "169.254.169.254",  # instance metadata
        "fd00:ec2::254",  # AWS metadata over IPv6
        "100.100.100.200",  # Alibaba metadata
        "168.63.129.16",  # Azure wire server
        "fe80::1",
        "fc00::1",
        "fd12:3456::1",
        "224.0.0.1",
        "ff02::1",
        "0.0.0.0",
        "::",
        "240.0.0.1",
        "::ffff:127.0.0.1",  # IPv4-mapped loopback
        "::ffff:10.0.0.1",
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "2002:c0a8:101::1",  # 6to4 of 192.168.1.1
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2001:4860:4860::8888", "2606:4700::1111"]
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_configured_networks_allow_exactly_themselves() -> None:
    allowed = parse_networks("10.1.0.0/16, ::1/128")
    assert refusal(ipaddress.ip_address("10.1.2.3"), allowed) is None
    assert refusal(ipaddress.ip_address("::1"), allowed) is None
    assert refusal(ipaddress.ip_address("10.2.0.1"), allowed) is not None
    assert refusal(ipaddress.ip_address("127.0.0.1"), allowed) is not None
    assert refusal(ipaddress.ip_address("169.254.169.254"), allowed) is not None
    with pytest.raises(ValueError):
        parse_networks("10.0.0.0/33")


def test_url_rules() -> None:
    assert url_problem("https://hooks.example.com/batch?x=1") is None
    assert url_problem("http://hooks.example.com:8080/") is None
    assert url_problem("ftp://hooks.example.com/") is not None
    assert url_problem("https:///nohost") is not None
    assert url_problem("http://host:99999/") is not None


def test_url_hosts_must_be_ascii_and_ipv4_in_dotted_decimal() -> None:
    assert url_problem("https://xn--mnchen-3ya.de/") is None
    assert "is not ASCII" in (url_problem("https://m\u00fcnchen.de/") or "")
    assert "is not ASCII" in (url_problem("http://public.example@127\u30020\u30020\u30021/") or "")
    assert url_problem("http://93.184.216.34/") is None
    why = url_problem("http://1572395042/")
    assert why == (
        "the URL's host 1572395042 is the IPv4 address 93.184.216.34: write it as 93.184.216.34"
    )


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0X7F.0.0.01", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("4294967295", "255.255.255.255"),
        ("93.184.216.34", "93.184.216.34"),
    ],
)
def test_ipv4_numbers_are_read_as_inet_aton_reads_them(host: str, address: str) -> None:
    assert ipv4_number(host) == ipaddress.IPv4Address(address)


@pytest.mark.parametrize(
    "host",
    [
        "hooks.example.com",
        "4294967296",
        "256.0.0.1",
        "1.2.3.4.5",
        "08.0.0.1",
        "1..2",
        "",
        "0x7g",
        "\uff11\uff12\uff17.0.0.1",
        "+1",
        "1_0",
        "127.0.0.1x",
    ],
)
def test_other_hosts_are_not_ipv4_numbers(host: str) -> None:
    assert ipv4_number(host) is None


def test_ip_literals_are_checked_before_any_connection() -> None:
    with pytest.raises(Refused):
        check_host("127.0.0.1", ())
    with pytest.raises(Refused):
        check_host("[::1]", ())
    with pytest.raises(Refused) as caught:
        check_host("2130706433", ())
    assert (
        str(caught.value) == "2130706433 is read as 127.0.0.1: 127.0.0.1 is not public (loopback)"
    )
    check_host("127.0.0.1", LOOPBACK)
    check_host("hooks.example.com", ())  # a name: the resolver checks it


def test_the_socket_guard_refuses_before_a_socket_exists_and_records_it() -> None:
    guard = GuardedSockets(())
    stream = (socket.SOCK_STREAM, socket.IPPROTO_TCP, "")
    with refusals() as refused:
        for info in [
            (socket.AF_INET, *stream, ("169.254.169.254", 80)),
            (socket.AF_INET6, *stream, ("fe80::1%lo", 80, 0, 1)),
            (socket.AF_INET6, *stream, ("::ffff:10.0.0.1", 80, 0, 0)),
            (socket.AF_UNIX, *stream, ("/run/docker.sock",)),
        ]:
            with pytest.raises(Refused):
                guard(info)
    assert refused == [
        "169.254.169.254 is a cloud metadata address",
        "fe80::1 is not public (link-local)",
        "::ffff:a00:1 carries 10.0.0.1: 10.0.0.1 is not public (private)",
        f"address family {socket.AF_UNIX} is not IPv4 or IPv6",
    ]
    with GuardedSockets(LOOPBACK)((socket.AF_INET, *stream, ("127.0.0.1", 80))) as allowed:
        assert allowed.family == socket.AF_INET


def test_the_resolver_checks_every_address_of_a_name() -> None:
    async def scenario() -> None:
        with pytest.raises(Refused, match="localhost resolves to"):
            await GuardedResolver(()).resolve("localhost", 80)
        results = await GuardedResolver(LOOPBACK).resolve("localhost", 80)
        assert results
        assert all(ipaddress.ip_address(r["host"]).is_loopback for r in results)

    asyncio.run(scenario())


# --- the sender against a real server ----------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(handler: Handler) -> tuple[web.AppRunner, int, list[web.Request]]:
    seen: list[web.Request] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        await request.read()
        return await handler(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, port, seen


def attempt(
    handler: Handler, allowed: Any = LOOPBACK, timeout: float = 2.0, host: str = "127.0.0.1"
) -> tuple[Any, list[web.Request]]:
    async def scenario() -> tuple[Any, list[web.Request]]:
        runner, port, seen = await serve(handler)
        sender = Sender(allowed, timeout, concurrency=2)
        try:
            result = await sender.post(f"http://{host}:{port}/hook", {"x-a": "1"}, b"{}")
        finally:
            await sender.close()
            await runner.cleanup()
        return result, seen

    return asyncio.run(scenario())


async def ok(_: web.Request) -> web.StreamResponse:
    return web.Response(text="thanks")


def test_a_2xx_answer_is_delivered() -> None:
    result, seen = attempt(ok)
    assert (result.ok, result.outcome, result.error) == (True, "delivered", None)
    assert len(seen) == 1
    assert seen[0].method == "POST"
    assert seen[0].headers["x-a"] == "1"


def test_loopback_is_refused_without_the_configuration_and_nothing_is_sent() -> None:
    for host in ("127.0.0.1", "localhost"):
        result, seen = attempt(ok, allowed=(), host=host)
        assert (result.ok, result.outcome) == (False, "refused"), result
        assert seen == []


def test_an_error_answer_keeps_the_start_of_its_body() -> None:
    async def boom(_: web.Request) -> web.StreamResponse:
        return web.Response(status=500, text="database down " + "x" * 100_000)

    result, _ = attempt(boom)
    assert (result.ok, result.outcome) == (False, "http_error")
    assert result.error.startswith("HTTP 500: database down")
    assert len(result.error) < 300


def test_redirects_are_not_followed() -> None:
    async def moved(request: web.Request) -> web.StreamResponse:
        if request.path == "/elsewhere":
            return web.Response(text="followed")
        raise web.HTTPFound("/elsewhere")

    result, seen = attempt(moved)
    assert (result.ok, result.outcome) == (False, "http_error")
    assert "HTTP 302" in result.error
    assert [r.path for r in seen] == ["/hook"]


def test_a_slow_endpoint_times_out() -> None:
    async def slow(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text="late")

    result, _ = attempt(slow, timeout=0.5)
    assert (result.ok, result.outcome) == (False, "timeout")
    assert result.seconds < 3


def test_a_huge_answer_is_read_only_up_to_the_limit() -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(status=200)
        await answer.prepare(request)
        try:
            for _ in range(10_000):  # 640 MiB if it were all read
                await answer.write(b"y" * 65536)
        except (ConnectionError, RuntimeError):
            pass
        return answer

    result, _ = attempt(huge, timeout=10)
    assert result.ok
    assert result.seconds < 5


def test_a_closed_port_is_a_network_error() -> None:
    async def scenario() -> Any:
        runner, port, _ = await serve(ok)
        await runner.cleanup()
        sender = Sender(LOOPBACK, 2.0, concurrency=1)
        try:
            return await sender.post(f"http://127.0.0.1:{port}/", {}, b"{}")
        finally:
            await sender.close()

    result = asyncio.run(scenario())
    assert (result.ok, result.outcome) == (False, "network_error")
