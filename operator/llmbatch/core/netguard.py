"""Which addresses an outgoing call of the operator may reach (webhook deliveries).

Only public unicast addresses, unless an operator-configured network allows more: never
loopback, private (RFC 1918, unique-local fc00::/7), link-local, shared (100.64/10), multicast,
reserved, unspecified, or a cloud metadata address. An IPv4-mapped or NAT64 / 6to4 / Teredo
IPv6 address is judged by the IPv4 address it carries. Pure: the checks at resolve and connect
time live in the controller (``llmbatch.controller.webhooks.guard``).

A delivery URL's host must be ASCII and, when it is an IPv4 address, written as one in dotted
decimal: IDNA folds Unicode digits and dots (full-width, circled, the ideographic full stop) into
an IP literal, and inet_aton and WHATWG URL parsers read ``2130706433``, ``0177.0.0.1``,
``0x7f.1`` or ``127.1`` as ``127.0.0.1``. Refusing both in the URL rule says plainly what the host
means; the connect-time check refuses the address whatever the host was written as.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS IMDS over IPv6
        "100.100.100.200",  # Alibaba Cloud
        "192.0.0.192",  # Oracle Cloud
        "168.63.129.16",  # Azure wire server (a public address)
    )
)
"""Cloud instance-metadata endpoints: refused unless a configured network names them."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_IPV4_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")
"""One part of an IPv4 number as inet_aton and WHATWG read it: hex, octal or decimal (ASCII)."""


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """Networks of a comma-separated CIDR list (``127.0.0.0/8,::1/128``); ValueError if bad."""
    return tuple(ipaddress.ip_network(part.strip()) for part in text.split(",") if part.strip())


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, NAT64, 6to4, Teredo), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(address: IPAddress, allowed: Sequence[IPNetwork] = ()) -> str | None:
    """Why ``address`` may not be reached, or None when it may."""
    if any(address.version == net.version and address in net for net in allowed):
        return None
    inner = embedded_ipv4(address)
    if inner is not None:
        why = refusal(inner, allowed)
        return f"{address} carries {inner}: {why}" if why else None
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    if address in _UNIQUE_LOCAL:
        return f"{address} is not public (unique-local)"
    for attribute, what in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_unspecified", "unspecified"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(address, attribute):
            return f"{address} is not public ({what})"
    if not address.is_global:
        return f"{address} is not public"
    return None


def first_refusal(addresses: Iterable[IPAddress], allowed: Sequence[IPNetwork] = ()) -> str | None:
    """The refusal of the first address refused (every address of a name must pass)."""
    for address in addresses:
        why = refusal(address, allowed)
        if why:
            return why
    return None


def ipv4_number(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address inet_aton and WHATWG URL parsers read in ``host``, or None.

    One to four dot-separated parts, each decimal, octal (leading 0) or hex (0x), the last one
    filling the remaining bytes: ``2130706433``, ``0177.0.0.1``, ``0x7f.1`` and ``127.1`` are all
    ``127.0.0.1``. A trailing dot is ignored, as WHATWG does.
    """
    parts = host.removesuffix(".").split(".")
    if not 1 <= len(parts) <= 4 or not all(_IPV4_PART.fullmatch(p) for p in parts):
        return None
    *head, last = [_ipv4_part(p) for p in parts]
    if any(n > 255 for n in head) or last >= 256 ** (4 - len(head)):
        return None
    value = last + sum(n << (8 * (3 - i)) for i, n in enumerate(head))
    return ipaddress.IPv4Address(value)


def _ipv4_part(part: str) -> int:
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)
    return int(part)


def host_problem(host: str) -> str | None:
    """What is wrong with a delivery URL's host as written, or None."""
    if not host.isascii():
        return (
            f"the URL's host {host!r} is not ASCII: write a name in its ASCII (xn--) form "
            "(Unicode digits and dots can spell an IP address)"
        )
    address = ipv4_number(host)
    if address is not None and str(address) != host:
        return f"the URL's host {host} is the IPv4 address {address}: write it as {address}"
    return None


def url_problem(url: str) -> str | None:
    """What is wrong with a delivery URL (scheme, host), or None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"bad URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "the URL's scheme must be http or https"
    if not parts.hostname:
        return "the URL has no host"
    if port == 0:
        return "the URL's port must not be 0"
    return host_problem(parts.hostname)
