"""The address guard of the platform's outgoing calls for tenants: every address checked where
the connection is made. The operator's webhook deliveries (``llmbatch.controller.webhooks``) and
the executor's fetches of remote media (``llmbatch.executor.mediafetch``) both connect through
:func:`guarded_session`.

One rule (:func:`llmbatch.core.netguard.refusal`), applied at three points of an attempt:

- :class:`GuardedSockets` is the connector's socket factory. aiohttp calls it with each address
  right before connecting to it, IP literals included, so whatever the URL's host was written as
  and however it was normalised on the way (IDNA folds a host of full-width digits and dots into
  the literal ``127.0.0.1``, which aiohttp connects to without resolving), no socket exists for
  a refused address. This is the check nothing before it can bypass.
- :class:`GuardedResolver` checks every address a name resolves to and refuses the whole name if
  one is refused, so the refusal names the host; aiohttp connects to exactly the addresses it
  returned, so a name that resolves differently at connect time (DNS rebinding) changes nothing.
- :func:`check_host` refuses an IP literal before the request, given the host exactly as aiohttp
  sees it (yarl's ``raw_host``), for a message that names what was written.

aiohappyeyeballs folds the errors of several addresses into one plain ``OSError("Multiple
exceptions: ...")``, so the socket guard also records what it refused (:func:`refusals`): a
caller classifies an attempt from that record, not from the type of the error it gets.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from llmbatch.core.netguard import IPAddress, IPNetwork, first_refusal, ipv4_number, refusal

AddrInfo = tuple[int, int, int, str, tuple[Any, ...]]
"""(family, type, proto, canonname, sockaddr): one getaddrinfo answer, what the factory gets."""

_REFUSED: ContextVar[list[str] | None] = ContextVar("llmbatch_outbound_refused", default=None)


class Refused(OSError):
    """The host is, or resolves to, an address the call may not reach."""


@contextlib.contextmanager
def refusals() -> Iterator[list[str]]:
    """The list of what the socket guard refuses inside the block (one attempt's record).

    A context variable because the factory is shared by every attempt of the connector: the
    connection attempts run in the request's task, or in the tasks happy eyeballs starts from
    it, which inherit the list set here and no other attempt's.
    """
    seen: list[str] = []
    token = _REFUSED.set(seen)
    try:
        yield seen
    finally:
        _REFUSED.reset(token)


def literal(host: str) -> IPAddress | None:
    """The address ``host`` is when it is an IP literal or an IPv4 number (``[::1]``, ``127.1``)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return ipv4_number(host)


def check_host(host: str, allowed: Sequence[IPNetwork]) -> None:
    """Raise :class:`Refused` when ``host`` is an IP literal that may not be reached."""
    address = literal(host)
    if address is None:
        return  # a name: the resolver checks what it resolves to
    why = refusal(address, allowed)
    if why:
        written = host.strip("[]")
        raise Refused(why if written == str(address) else f"{host} is read as {address}: {why}")


class GuardedSockets:
    """The connector's ``socket_factory``: a socket for an allowed address; :class:`Refused`,
    recorded in :func:`refusals`, before any socket exists for another."""

    def __init__(self, allowed: Sequence[IPNetwork]) -> None:
        self.allowed = tuple(allowed)

    def __call__(self, addr_info: AddrInfo) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        why = self.refusal(family, sockaddr)
        if why:
            seen = _REFUSED.get()
            if seen is not None:
                seen.append(why)
            raise Refused(why)
        return socket.socket(family, kind, proto)

    def refusal(self, family: int, sockaddr: tuple[Any, ...]) -> str | None:
        """Why the connector may not connect to ``sockaddr``, or None."""
        if family not in (socket.AF_INET, socket.AF_INET6):
            return f"address family {family} is not IPv4 or IPv6"
        try:  # an IPv6 sockaddr's host may carry a zone (fe80::1%eth0): judged without it
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            return f"{sockaddr[0]!r} is not an IP address"
        return refusal(address, self.allowed)


class GuardedResolver(ThreadedResolver):
    """getaddrinfo, then every address checked; :class:`Refused` if any is refused."""

    def __init__(self, allowed: Sequence[IPNetwork]) -> None:
        super().__init__()
        self.allowed = tuple(allowed)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_UNSPEC
    ) -> list[ResolveResult]:
        """The addresses of ``host``, all allowed; :class:`Refused` otherwise."""
        results = await super().resolve(host, port, family)
        addresses = [ipaddress.ip_address(r["host"].split("%", 1)[0]) for r in results]
        why = first_refusal(addresses, self.allowed)
        if why:
            raise Refused(f"{host} resolves to {why}")
        if not results:
            raise Refused(f"{host} resolves to no address")
        return results


def guarded_session(
    allowed: Sequence[IPNetwork],
    timeout: aiohttp.ClientTimeout,
    *,
    limit: int,
    user_agent: str,
    resolver: AbstractResolver | None = None,
) -> aiohttp.ClientSession:
    """A client session whose every connection is guarded (resolver and socket factory), that
    resolves afresh on every connection, keeps none open, ignores proxies from the environment
    and hands bodies over as sent (no content decoding: what is read is what was capped)."""
    connector = aiohttp.TCPConnector(
        resolver=resolver or GuardedResolver(allowed),
        socket_factory=GuardedSockets(allowed),
        use_dns_cache=False,  # every attempt resolves, and checks, afresh
        limit=limit,
        force_close=True,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        auto_decompress=False,
        trust_env=False,
        headers={"user-agent": user_agent},
    )
