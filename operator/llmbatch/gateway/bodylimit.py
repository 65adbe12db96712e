"""A cap on JSON request bodies: FastAPI would otherwise read any size into memory."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.types import Message

from llmbatch.gateway.errors import APIError

MAX_CREATE_BODY_BYTES = 1 << 20
"""Largest ``POST /v1/batches`` body. Inline requests are stored in the Batch object, and the
API server keeps an object to ~1.5 MiB: a larger input has to be uploaded as a file."""


def body_too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"The request body is larger than {limit} bytes; upload the requests as a file "
        "(POST /v1/files) and pass its id as input_file_id.",
        code="request_too_large",
    )


class CappedBodyRoute(APIRoute):
    """A route that reads at most :data:`MAX_CREATE_BODY_BYTES` of body (413 beyond).

    The body is read here, before FastAPI parses it: an error raised while FastAPI reads it
    would be turned into a generic 400.
    """

    max_body_bytes = MAX_CREATE_BODY_BYTES

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        if self.body_field is None:  # FastAPI reads no body for it
            return handler
        limit = self.max_body_bytes

        async def capped(request: Request) -> Response:
            length = request.headers.get("content-length", "")
            if length.isdigit() and int(length) > limit:
                raise body_too_large(limit)
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise body_too_large(limit)
            replayed = False

            async def receive() -> Message:
                nonlocal replayed
                if replayed:
                    return await request.receive()
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}

            return await handler(Request(request.scope, receive))

        return capped
