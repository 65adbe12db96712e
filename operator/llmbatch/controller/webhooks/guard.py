"""The address guard of webhook deliveries: a resolver that refuses non-public addresses.

aiohttp connects to exactly the addresses its resolver returns, so resolving once here, checking
every address (:func:`llmbatch.core.netguard.refusal`) and handing back only checked ones means a
name that resolves differently at connect time (DNS rebinding) cannot reach a refused address.
aiohttp skips the resolver for an IP literal host: :func:`check_host` covers that case.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from aiohttp.abc import ResolveResult
from aiohttp.resolver import ThreadedResolver

from llmbatch.core.netguard import IPNetwork, first_refusal, refusal


class Refused(OSError):
    """The host is, or resolves to, an address deliveries may not reach."""


def check_host(host: str, allowed: Sequence[IPNetwork]) -> None:
    """Raise :class:`Refused` when ``host`` is an IP literal that may not be reached."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return  # a name: the resolver checks what it resolves to
    why = refusal(address, allowed)
    if why:
        raise Refused(why)


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
