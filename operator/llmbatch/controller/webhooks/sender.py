"""One HTTP attempt of a webhook delivery: guarded addresses, timeouts, a bounded answer.

No redirects are followed (a 3xx is a failed attempt), no proxy from the environment is used,
the answer is read up to :data:`MAX_ANSWER` bytes (undecoded) and the connection closed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from llmbatch.controller.webhooks.guard import GuardedResolver, Refused, check_host
from llmbatch.core.netguard import IPNetwork

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

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.allowed),
                use_dns_cache=False,
                limit=self.concurrency * 4,
                force_close=True,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                auto_decompress=False,
                trust_env=False,
                headers={"user-agent": "llmbatch-webhooks/1"},
            )
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> Attempt:
        """One attempt; never raises for what the endpoint or the network does."""
        started = time.monotonic()
        try:
            check_host(urlsplit(url).hostname or "", self.allowed)
            async with self._client().post(
                url, data=body, headers=headers, allow_redirects=False
            ) as answer:
                start = await answer.content.read(MAX_ANSWER)
                status = answer.status
        except Refused as exc:
            return Attempt(False, "refused", f"refused: {exc}", time.monotonic() - started)
        except aiohttp.ClientConnectorError as exc:
            outcome = "refused" if isinstance(exc.os_error, Refused) else "network_error"
            why = f"refused: {exc.os_error}" if outcome == "refused" else str(exc)
            return Attempt(False, outcome, why, time.monotonic() - started)
        except TimeoutError:
            why = f"no answer within {self.timeout.total:g}s"
            return Attempt(False, "timeout", why, time.monotonic() - started)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            why = f"{type(exc).__name__}: {exc}"
            return Attempt(False, "network_error", why, time.monotonic() - started)
        seconds = time.monotonic() - started
        if 200 <= status < 300:
            return Attempt(True, "delivered", None, seconds)
        snippet = start[:_SNIPPET].decode("utf-8", "replace").strip()
        return Attempt(False, "http_error", f"HTTP {status}: {snippet}".rstrip(": "), seconds)
