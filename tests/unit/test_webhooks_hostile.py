"""Hostile delivery URLs against a real listener on 127.0.0.1 that must receive nothing.

Every URL below is a way to write a loopback (or metadata) address that a check of the URL's
text can miss: Unicode digits and dots that IDNA folds into ASCII, IPv4 numbers inet_aton reads,
IPv4-mapped IPv6, userinfo before the real host, DNS that changes its answer between the
configuration check and the delivery. Each goes through :class:`Sender` with the default
configuration (public addresses only) and must come back ``refused`` with no request seen. The
positive controls prove the listener can receive: with loopback allowed, the same URLs deliver.
"""

# ruff: noqa: RUF001 -- the corpus is made of confusable characters on purpose

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import ThreadedResolver
from aiohttp.web import Request

from llmbatch.api.resources import BatchWebhookSpec
from llmbatch.controller.webhooks import GuardedSockets, Refused, Sender, refusals
from llmbatch.controller.webhooks.check import problem
from llmbatch.controller.webhooks.kubeio import WebhookIO
from llmbatch.core.netguard import parse_networks, url_problem
from llmbatch.core.webhooks import SIGNING_LABEL
from tests.fixtures.fakekube import FakeKube
from tests.fixtures.webhooks import ScriptedDNS, listen

LOOPBACK = parse_networks("127.0.0.0/8,::1/128")

UNICODE = [
    "http://１２７．０．０．１:{port}/hook",  # full-width digits and dots
    "http://①②⑦.0.0.1:{port}/hook",  # circled digits
    "http://127。0。0。1:{port}/hook",  # ideographic full stop
    "http://127｡0｡0｡1:{port}/hook",  # halfwidth ideographic full stop
    "http://１２７.0.0.１:{port}/hook",  # some digits full-width
    "http://ｌｏｃａｌｈｏｓｔ:{port}/hook",  # a full-width name
]
NUMBERS = [
    "http://2130706433:{port}/hook",  # decimal
    "http://0177.0.0.1:{port}/hook",  # octal
    "http://0x7f.1:{port}/hook",  # hex, short
    "http://0x7f000001:{port}/hook",  # hex
    "http://127.1:{port}/hook",  # short
    "http://127.0.0.1.:{port}/hook",  # dotted decimal with a trailing dot
]
OTHERS = [
    "http://[::ffff:127.0.0.1]:{port}/hook",  # IPv4-mapped IPv6
    "http://[::ffff:7f00:1]:{port}/hook",
    "http://0.0.0.0:{port}/hook",  # Linux connects this to the local host
    "http://[::]:{port}/hook",
    "http://[::1]:{port}/hook",
    "http://localhost:{port}/hook",
    "http://localhost.:{port}/hook",
    "http://LocalHost:{port}/hook",
    "http://public.example@127.0.0.1:{port}/hook",  # userinfo before the real host
    "http://public.example:443@127.0.0.1:{port}/hook",
    "http://127.0.0.1:{port}#@public.example/",
]
METADATA = [
    "http://１６９．２５４．１６９．２５４/latest/meta-data/",
    "http://169。254。169。254/latest/meta-data/",
]
LOCALHOST_DOT = {"localhost.": [["127.0.0.1", "::1"]]}
"""This machine's resolver does not answer ``localhost.``; most answer it with loopback."""


async def post_to(sender: Sender, url: str) -> tuple[Any, list[Request]]:
    runner, port, seen = await listen()
    try:
        result = await sender.post(url.format(port=port), {}, b'{"id": "evt_1"}')
    finally:
        await sender.close()
        await runner.cleanup()
    return result, seen


def deliver(url: str, allowed: Any = ()) -> tuple[Any, list[Request]]:
    return asyncio.run(post_to(Sender(allowed, 2.0, concurrency=2), url))


@pytest.mark.parametrize("url", UNICODE + NUMBERS + OTHERS + METADATA)
def test_a_hostile_url_is_refused_and_nothing_is_sent(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ScriptedDNS(monkeypatch, LOCALHOST_DOT)
    result, seen = deliver(url)
    assert seen == []
    assert (result.ok, result.outcome) == (False, "refused"), result
    assert result.error.startswith("refused: ")


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/hook",
        "http://１２７．０．０．１:{port}/hook",
        "http://①②⑦.0.0.1:{port}/hook",
        "http://127。0。0。1:{port}/hook",
        "http://localhost.:{port}/hook",
        "http://public.example@127.0.0.1:{port}/hook",
    ],
)
def test_with_loopback_allowed_the_listener_receives(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ScriptedDNS(monkeypatch, {"localhost.": [["127.0.0.1"]]})
    result, seen = deliver(url, LOOPBACK)
    assert (result.ok, result.outcome) == (True, "delivered"), result
    assert [r.path for r in seen] == ["/hook"]


@pytest.mark.parametrize(
    ("url", "message"),
    [(url, "is not ASCII") for url in UNICODE + METADATA]
    + [(url, "write it as 127.0.0.1") for url in NUMBERS if "0x7f.1" not in url]
    + [("http://0x7f.1:{port}/hook", "host 0x7f.1 is the IPv4 address 127.0.0.1")],
)
def test_the_url_rule_names_what_a_disguised_host_is(url: str, message: str) -> None:
    assert message in (url_problem(url.format(port=8080)) or "")


# --- the connect-time check on its own ---------------------------------------------------------


class TrustingSender(Sender):
    """A Sender whose resolver checks nothing: what the socket guard stops on its own."""

    def _resolver(self) -> AbstractResolver:
        return ThreadedResolver()


def test_the_socket_guard_alone_refuses_a_literal_idna_folded_into_loopback() -> None:
    async def scenario() -> tuple[BaseException, list[str], list[Request]]:
        runner, port, seen = await listen()
        connector = aiohttp.TCPConnector(socket_factory=GuardedSockets(()), force_close=True)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                with refusals() as refused, pytest.raises(aiohttp.ClientConnectorError) as caught:
                    await session.post(f"http://１２７．０．０．１:{port}/hook", data=b"{}")
        finally:
            await runner.cleanup()
        return caught.value, refused, seen

    error, refused, seen = asyncio.run(scenario())
    assert isinstance(error, aiohttp.ClientConnectorError)
    assert isinstance(error.os_error, Refused)
    assert refused == ["127.0.0.1 is not public (loopback)"]
    assert seen == []


def test_a_name_with_several_refused_addresses_is_refused_not_a_network_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two families: happy eyeballs folds both refusals into one plain OSError("Multiple
    # exceptions: ..."), which only the attempt's record says was a refusal.
    ScriptedDNS(monkeypatch, {"twice.test": [["127.0.0.1", "::1"]]})
    result, seen = asyncio.run(post_to(TrustingSender((), 2.0, 2), "http://twice.test:{port}/"))
    assert seen == []
    assert (result.ok, result.outcome) == (False, "refused"), result
    assert "127.0.0.1 is not public" in result.error
    assert "::1 is not public" in result.error


# --- DNS rebinding between the configuration check and the delivery ---------------------------


def signing_secret(kube: FakeKube) -> None:
    secret = "whsec_" + base64.b64encode(b"a key of thirty-two bytes length").decode()
    kube.add(
        "secrets",
        {
            "metadata": {"namespace": "t", "name": "signing", "labels": {SIGNING_LABEL: "true"}},
            "data": {"secret": base64.b64encode(secret.encode()).decode()},
        },
    )


def test_dns_answering_public_then_loopback_is_refused_at_delivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dns = ScriptedDNS(monkeypatch, {"rebind.test": [["93.184.216.34"], ["127.0.0.1"]]})
    kube = FakeKube()
    signing_secret(kube)

    async def scenario() -> tuple[str | None, Any, list[Request]]:
        runner, port, seen = await listen()
        url = f"http://rebind.test:{port}/hook"
        spec = BatchWebhookSpec.model_validate({"url": url, "secretRef": {"name": "signing"}})
        sender = Sender((), 2.0, concurrency=2)
        try:
            configured = await problem(WebhookIO(kube), "t", spec, (), 2.0)  # type: ignore[arg-type]
            result = await sender.post(url, {}, b"{}")
        finally:
            await sender.close()
            await runner.cleanup()
        return configured, result, seen

    configured, result, seen = asyncio.run(scenario())
    assert configured is None  # the check saw the public address
    assert dns.asked["rebind.test"] == 2
    assert (result.ok, result.outcome) == (False, "refused"), result
    assert "rebind.test resolves to 127.0.0.1 is not public" in result.error
    assert seen == []
