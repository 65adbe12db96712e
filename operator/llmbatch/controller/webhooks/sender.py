"""One HTTP attempt of a webhook delivery: guarded addresses, timeouts, a bounded answer.

Every address is checked where the connection is made (:mod:`llmbatch.outbound.guard`: the
connector's resolver and socket factory), and an IP literal before the request. No redirects
are followed (a 3xx is a failed attempt), no proxy from the environment is used, the answer is
read up to :data:`MAX_ANSWER` bytes (undecoded) and the connection closed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver
from yarl import URL

from llmbatch.core.netguard import IPNetwork
from llmbatch.outbound.guard import (
    GuardedResolver,
    Refused,
    check_host,
    guarded_session,
    refusals,
)

MAX_ANSWER = 64 * 1024
"""Bytes of an answer read at most (the rest is discarded with the connection)."""
_SNIPPET = 200


@dataclass(frozen=True)
class Attempt:
    """What one POST came to."""

    ok: bool
    """The endpoint answered 2xx."""
    outcome: str
    """delivered, http_error, timeout, refused or network_error (the metric's label)."""
    error: str | None
    """Why it failed, for the records and Events."""
    seconds: float
    """Duration of the attempt."""


class Sender:
    """POSTs signed events; one connection pool, guarded by the address rules."""

    def __init__(self, allowed: Sequence[IPNetwork], timeout: float, concurrency: int) -> None:
        self.allowed = tuple(allowed)
        self.timeout = aiohttp.ClientTimeout(
            total=timeout, connect=min(timeout, 5.0), sock_read=timeout
        )
        self.concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _resolver(self) -> AbstractResolver:
        """The connector's resolver: every address of a name checked, or the name refused."""
        return GuardedResolver(self.allowed)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = guarded_session(
                self.allowed,
                self.timeout,
                limit=self.concurrency * 4,
                user_agent="llmbatch-webhooks/1",
                resolver=self._resolver(),
            )
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Attempt:
        """One attempt; never raises for what the endpoint or the network does."""
        started = time.monotonic()
        with refusals() as refused:
            try:
                status, start = await self._exchange(url, headers, body)
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                outcome, why = self._failure(exc, refused)
                return Attempt(False, outcome, why, time.monotonic() - started)
        seconds = time.monotonic() - started
        if 200 <= status < 300:
            return Attempt(True, "delivered", None, seconds)
        snippet = start[:_SNIPPET].decode("utf-8", "replace").strip()
        return Attempt(False, "http_error", f"HTTP {status}: {snippet}".rstrip(": "), seconds)

    async def _exchange(self, url: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """POST and read the start of the answer: (status, its first bytes)."""
        check_host(URL(url).raw_host or "", self.allowed)  # the host as aiohttp connects to it
        async with self._client().post(
            url, data=body, headers=headers, allow_redirects=False
        ) as answer:
            return answer.status, await answer.content.read(MAX_ANSWER)

    def _failure(self, exc: Exception, refused: list[str]) -> tuple[str, str]:
        """The outcome and error of a failed attempt, given what the socket guard refused."""
        if isinstance(exc, aiohttp.ClientConnectorError):
            return _not_connected(exc, refused)
        if isinstance(exc, Refused):
            return "refused", f"refused: {exc}"  # an IP literal, before the request
        if isinstance(exc, TimeoutError):
            return "timeout", f"no answer within {self.timeout.total:g}s"
        return "network_error", f"{type(exc).__name__}: {exc}"


def _not_connected(exc: aiohttp.ClientConnectorError, refused: list[str]) -> tuple[str, str]:
    if refused:  # happy eyeballs may have folded them into one "Multiple exceptions" OSError
        return "refused", "refused: " + "; ".join(dict.fromkeys(refused))
    if isinstance(exc.os_error, Refused):
        return "refused", f"refused: {exc.os_error}"  # the resolver
    return "network_error", str(exc)
