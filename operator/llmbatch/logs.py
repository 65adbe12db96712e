"""Log setup shared by the operator, the gateway and the executor.

``LLMBATCH_LOG_FORMAT=json`` makes every record one JSON object per line (``ts``, ``level``,
``logger``, ``message``, ``exc`` when there is one) carrying the batch id, shard and tenant where
the code knows them: from :func:`bind` (a context variable, so every record logged while a
reconcile, request or shard runs carries them), from ``extra={...}`` on the call, and from kopf's
per-object loggers (a Batch's name gives its id, its namespace the tenant). Otherwise (``text``,
the default) the usual one-line text format.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from llmbatch.core.ids import batch_id_from_name

FORMAT_ENV = "LLMBATCH_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: The fields a record may carry, in output order.
FIELDS = ("batch_id", "shard", "tenant", "slot")

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "llmbatch_log_context", default=None
)


def bind_context(**fields: Any) -> None:
    """Attach ``fields`` (batch_id, shard, tenant) to every record logged in this context from
    now on (a request's or task's context: it ends with it)."""
    _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Attach ``fields`` to the records logged inside the block."""
    token = _context.set({**(_context.get() or {}), **fields})
    try:
        yield
    finally:
        _context.reset(token)


class JSONFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = dict(_context.get() or {})
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict) and ref.get("kind") == "Batch":
            name = str(ref.get("name") or "")
            if name.startswith("batch-"):
                fields.setdefault("batch_id", batch_id_from_name(name))
            fields.setdefault("tenant", ref.get("namespace"))
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                fields[name] = value
        out.update({k: fields[k] for k in FIELDS if fields.get(k) is not None})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def json_requested() -> bool:
    """Whether ``LLMBATCH_LOG_FORMAT`` asks for JSON (anything else: text)."""
    return os.environ.get(FORMAT_ENV, "text").strip().lower() == "json"


def configure(level: int | str, stream: TextIO | None = None) -> None:
    """Configure the root logger once: JSON or text per ``LLMBATCH_LOG_FORMAT``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JSONFormatter() if json_requested() else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)


def uvicorn_log_config() -> dict[str, Any] | None:
    """uvicorn's own loggers through the root handler when JSON is on (None: uvicorn's default)."""
    if not json_requested():
        return None
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "loggers": {
            name: {"handlers": [], "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
        },
    }
