"""The OpenAI error envelope for every failure the gateway answers with."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from llmbatch.api.openai import ErrorBody, ErrorEnvelope

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"


class APIError(Exception):
    """An error answer: HTTP status plus the OpenAI ``{message, type, param, code}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def response(self) -> JSONResponse:
        return error_response(
            self.status, self.message, self.type, self.param, self.code, self.headers
        )


def error_response(
    status: int,
    message: str,
    type: str = INVALID_REQUEST,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorEnvelope(error=ErrorBody(message=message, type=type, param=param, code=code))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


def not_found(kind: str, ident: str, param: str | None = None) -> APIError:
    """404 for a missing id — also what another tenant's id gets."""
    shown = ident if len(ident) <= 128 else ident[:128] + "..."
    return APIError(404, f"No such {kind}: '{shown}'", param=param, code=None)


def store_unavailable() -> APIError:
    """503 for an object store that failed (the client retries)."""
    return APIError(
        503,
        "The file store is temporarily unavailable; retry shortly.",
        type="server_error",
        code="service_unavailable",
        headers={"Retry-After": "1"},
    )


def rate_limited(retry_after: str, rate: float, burst: int) -> APIError:
    """429 for a key over its request rate, as OpenAI answers one (``type: requests``)."""
    return APIError(
        429,
        f"Rate limit reached for requests: an API key may send {burst} requests at once and "
        f"{rate:g} per second after that. Please try again in {retry_after}s.",
        type="requests",
        code="rate_limit_exceeded",
        headers={"Retry-After": retry_after},
    )


def unauthorized(message: str) -> APIError:
    return APIError(401, message, param=None, code="invalid_api_key")


def _param_of(loc: tuple[Any, ...] | list[Any]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    if not parts:
        return None
    out = parts[0]
    for part in parts[1:]:
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None, str | None]:
    errors = list(exc.errors())
    if not errors:
        return "Invalid request.", None, None
    first = errors[0]
    kind = str(first.get("type", ""))
    loc = first.get("loc") or ()
    if kind == "json_invalid":
        return (
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)",
            None,
            "invalid_json",
        )
    param = _param_of(loc)
    msg = str(first.get("msg", "invalid value"))
    if kind == "missing":
        return f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    where = f"'{param}'" if param else "the request body"
    return f"Invalid value for {where}: {msg}.", param, "invalid_value"


def install_handlers(app: FastAPI) -> None:
    """Every error leaves as the OpenAI envelope: ours, FastAPI's validation, 404/405, crashes."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = _validation_message(exc)
        return error_response(400, message, INVALID_REQUEST, param, code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
            return error_response(404, message, INVALID_REQUEST, None, "unknown_url")
        if exc.status_code == 405:
            message = f"Method {request.method} is not allowed for {request.url.path}"
            return error_response(405, message, INVALID_REQUEST, None, "method_not_allowed")
        return error_response(
            exc.status_code, str(exc.detail), INVALID_REQUEST, None, None, dict(exc.headers or {})
        )

    @app.exception_handler(TimeoutError)
    @app.exception_handler(aiohttp.ClientError)
    async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
        log.warning("backend unreachable on %s %s: %r", request.method, request.url.path, exc)
        return error_response(
            503,
            "The service is temporarily unable to reach its backing store; retry shortly.",
            "server_error",
            None,
            "service_unavailable",
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(
            500, "The server had an error processing your request.", "server_error", None, None
        )
