"""JSON answers, and the error responses every ``/v1`` route documents."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response
from pydantic import BaseModel

from llmbatch.api.openai import ErrorEnvelope


def json_response(model: BaseModel, status: int = 200) -> Response:
    """``model`` as JSON, serialised by orjson rather than FastAPI's encoder."""
    return Response(
        orjson.dumps(model.model_dump(mode="json")),
        status_code=status,
        media_type="application/json",
    )


def json_data(data: Any) -> Response:
    """Plain JSON data (already JSON types)."""
    return Response(orjson.dumps(data), media_type="application/json")


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorEnvelope, "description": text}
    for code, text in (
        (400, "Invalid request"),
        (401, "Missing or bad API key"),
        (403, "Key lacks the scope"),
        (404, "Unknown id"),
        (409, "Conflict"),
        (402, "Not enough credit"),
        (413, "File or request body too large"),
        (429, "Queue full"),
    )
}
