"""A request's media on its way to the engine: remote URLs fetched here, every part checked.

Validation already refused every shape the allow-list does not take
(``llmbatch.core.validation.parts``); the executor looks again, on the parsed body it is about
to send, so that nothing the engine would fetch or decode gets past it whatever wrote the shard
(an older operator, a Batch edited by hand):

* an http(s) URL is fetched by the executor (``llmbatch.executor.mediafetch``, through the
  address guard) and replaced by a ``data:`` URL, or, where remote media is not allowed, the
  request becomes an error line: the engine never fetches anything;
* a fetched image's header is read like an inline one's at validation (the pool's pixel cap);
* a request with media is marked (``EngineRequest.media``): the slot names it in a heartbeat
  before it enters the engine.
"""

from __future__ import annotations

import base64
import copy
import dataclasses

from llmbatch.api.shard import MediaLimits
from llmbatch.core.validation import MediaPart, content_parts, image_problem
from llmbatch.core.validation.imagesize import image_size
from llmbatch.core.validation.media import REMOTE
from llmbatch.executor.engines.base import (
    Engine,
    EngineRequest,
    EngineResult,
    error_body,
)
from llmbatch.executor.mediafetch import Fetchers, FetchFailed


class MediaGate(Engine):
    """An engine as one shard run sees it, one step before the slot's shared engine."""

    def __init__(self, inner: Engine, limits: MediaLimits, fetchers: Fetchers) -> None:
        self.inner = inner
        self.limits = limits
        self.fetchers = fetchers
        self.name = inner.name

    @property
    def max_num_seqs(self) -> int:
        return self.inner.max_num_seqs

    async def start(self) -> None:
        await self.inner.start()

    def dead_reason(self) -> str | None:
        return self.inner.dead_reason()

    async def close(self) -> None:
        return None  # the slot closes the engine and the fetchers

    async def handle(self, request: EngineRequest) -> EngineResult:
        parts, problem = content_parts(request.body, request.url)
        if problem is not None:
            return _refused(problem.code, problem.message, problem.param)
        if not parts:
            return await self.inner.handle(request)
        body = request.body
        if any(_remote(part) for part in parts):
            body = copy.deepcopy(body)
            parts, _ = content_parts(body, request.url)
            for part in parts:
                if _remote(part):
                    failed = await self._inline(part)
                    if failed is not None:
                        return failed
        return await self.inner.handle(dataclasses.replace(request, body=body, media=True))

    async def _inline(self, part: MediaPart) -> EngineResult | None:
        """Fetch the remote media of ``part`` and put it in place as a ``data:`` URL; the
        error answer when it cannot be."""
        settings = self.limits.remote
        if settings is None:
            why = f"{part.param} is a remote URL, and this platform does not fetch remote media."
            return _refused("remote_media_not_allowed", why, part.param)
        try:
            data, content_type = await self.fetchers.of(settings).fetch(str(part.value))
        except FetchFailed as exc:
            return _refused(exc.code, f"{part.param} could not be fetched: {exc.why}.", part.param)
        if part.modality == "image":
            problem = image_problem(data, self.limits.max_image_pixels)
            if problem is not None:
                code, what = problem
                return _refused(str(code), f"{part.param} (fetched) {what}", part.param)
            size = image_size(data)
            kind = f"image/{size.format if size else 'png'}"
        else:
            kind = content_type if content_type.startswith("audio/") else "audio/wav"
        part.holder[part.key] = f"data:{kind};base64,{base64.b64encode(data).decode()}"
        return None


def _remote(part: MediaPart) -> bool:
    value = part.value
    return part.source == "url" and type(value) is str and value.startswith(REMOTE)


def _refused(code: str, message: str, param: str | None) -> EngineResult:
    return EngineResult(400, error_body(message, status_code=400, param=param, code=str(code)))
