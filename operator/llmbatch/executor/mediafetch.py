"""Remote media fetched by the executor itself, through the platform's address guard.

Where remote media is allowed (the chart's ``remoteMedia.enabled``), an http(s) image or audio
URL of a row is fetched here, never by the engine: vLLM's media connector follows redirects and
checks no address. Every connection goes through :func:`llmbatch.outbound.guard.guarded_session`
(the webhooks' guard: every address a name resolves to, and every socket, checked against
:func:`llmbatch.core.netguard.refusal`); redirects are followed by hand, each hop's URL checked
like the first; the body is read up to ``max_bytes`` and the whole fetch bounded by
``timeout_seconds``. The bytes then go to the engine as a ``data:`` URL
(``llmbatch.executor.mediagate``).

What a refused or failed fetch tells the tenant is deliberately little: "refused" for an address
the guard refuses (before any connection), "could not be fetched" with an HTTP status or
"no answer" otherwise, so an error file cannot map which private addresses answer.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from llmbatch.api.shard import RemoteMedia
from llmbatch.core.netguard import parse_networks, url_problem
from llmbatch.outbound.guard import Refused, check_host, guarded_session, refusals

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 64 * 1024


class FetchFailed(Exception):
    """A remote media URL that could not be used: ``code`` is the error line's code."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code = code
        self.why = why


class MediaFetcher:
    """Fetches media URLs for one slot (one connection pool, guarded)."""

    def __init__(self, settings: RemoteMedia) -> None:
        self.settings = settings
        self.allowed = parse_networks(",".join(settings.allowed_networks))
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            seconds = self.settings.timeout_seconds
            timeout = aiohttp.ClientTimeout(total=seconds, connect=min(seconds, 5.0))
            self._session = guarded_session(
                self.allowed, timeout, limit=16, user_agent="llmbatch-media/1"
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def fetch(self, url: str) -> tuple[bytes, str]:
        """The body of ``url`` and its content type; :class:`FetchFailed` when it cannot be
        had within the settings (refused, too large, too many redirects, no answer)."""
        seconds = self.settings.timeout_seconds
        with refusals() as refused:
            try:
                async with asyncio.timeout(seconds):
                    return await self._follow(url)
            except FetchFailed:
                raise
            except Refused as exc:
                raise FetchFailed("remote_media_refused", f"refused: {exc}") from exc
            except TimeoutError as exc:
                raise FetchFailed(
                    "remote_media_unavailable", f"no answer within {seconds:g} s"
                ) from exc
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                guard = getattr(exc, "os_error", None)
                if refused or isinstance(guard, Refused):
                    why = "; ".join(dict.fromkeys(refused)) or str(guard)
                    raise FetchFailed("remote_media_refused", f"refused: {why}") from exc
                raise FetchFailed(
                    "remote_media_unavailable", "the host could not be reached"
                ) from exc

    async def _follow(self, url: str) -> tuple[bytes, str]:
        for _ in range(self.settings.max_redirects + 1):
            problem = url_problem(url)
            if problem is not None:
                raise FetchFailed("remote_media_refused", f"refused: {problem}")
            check_host(URL(url).raw_host or "", self.allowed)
            headers = {"accept-encoding": "identity"}
            async with self._client().get(url, allow_redirects=False, headers=headers) as answer:
                if answer.status in _REDIRECTS and "location" in answer.headers:
                    url = urljoin(url, answer.headers["location"])
                    continue
                if answer.status != 200:
                    raise FetchFailed("remote_media_unavailable", f"HTTP {answer.status}")
                data = await self._body(answer)
                return data, answer.headers.get("content-type", "").split(";")[0].strip()
        most = self.settings.max_redirects
        raise FetchFailed("remote_media_refused", f"more than {most} redirects")

    async def _body(self, answer: aiohttp.ClientResponse) -> bytes:
        most = self.settings.max_bytes
        if (answer.content_length or 0) > most:
            raise FetchFailed("remote_media_too_large", f"larger than {most} bytes")
        data = bytearray()
        async for chunk in answer.content.iter_chunked(_CHUNK):
            data += chunk
            if len(data) > most:
                raise FetchFailed("remote_media_too_large", f"larger than {most} bytes")
        return bytes(data)


class Fetchers:
    """A slot's fetchers, one per distinct setting (every shard of a pool has the same)."""

    def __init__(self) -> None:
        self._by_settings: dict[str, MediaFetcher] = {}

    def of(self, settings: RemoteMedia) -> MediaFetcher:
        key = json.dumps(settings.model_dump(mode="json"), sort_keys=True)
        if key not in self._by_settings:
            self._by_settings[key] = MediaFetcher(settings)
        return self._by_settings[key]

    async def close(self) -> None:
        for fetcher in self._by_settings.values():
            await fetcher.close()
        self._by_settings.clear()
