"""The interface every engine implements: start once, answer requests concurrently, stop."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any


class EngineConfigError(Exception):
    """The engine cannot start with this configuration (bad args, missing model)."""


class EngineDead(Exception):
    """The engine stopped working; results it gives from now on are not real answers."""


@dataclass(frozen=True)
class EngineRequest:
    """One request line, ready for the engine."""

    custom_id: str
    url: str
    body: dict[str, Any]
    request_id: str
    priority: int = 0
    """Engine scheduling priority, lower first (vLLM's convention): the shard's tier rank."""
    isolated: bool = False
    """Send it with nothing else in the engine: it was in the engine when the engine crashed
    before, so a second crash can be laid at its door alone (``executor.slot.EngineGate``)."""
    media: bool = False
    """It holds an image or audio part (set by ``executor.mediagate.MediaGate``): the slot names
    it in a heartbeat before it enters the engine, so an out-of-memory kill of the slot can be
    laid at its door (``core.oomblame``)."""


@dataclass(frozen=True)
class EngineResult:
    """The HTTP-style answer an endpoint gave: a body and its status code."""

    status_code: int
    body: dict[str, Any]
    busy_seconds: float = 0.0
    """This answer's share of its slot's busy time (set on a slot by ``SharedEngine``): while
    n requests are in the engine each accrues 1/n of the time. GPU-time billing charges the
    shares of committed results only (docs/billing.md)."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


class Engine(abc.ABC):
    """An engine serving one model for the three batch endpoints."""

    name: str = "engine"

    @property
    @abc.abstractmethod
    def max_num_seqs(self) -> int:
        """How many requests the engine runs at once (the executor keeps twice that in flight)."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Load the model; raise :class:`EngineConfigError` for an unusable configuration."""

    @abc.abstractmethod
    async def handle(self, request: EngineRequest) -> EngineResult:
        """Answer one request. Request-level problems are results (status >= 400), not raises.

        Raises :class:`EngineDead` when the engine itself has failed.
        """

    @abc.abstractmethod
    def dead_reason(self) -> str | None:
        """Why the engine is dead, or None while it works."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the engine (idempotent)."""


def error_body(
    message: str,
    *,
    status_code: int,
    param: str | None = None,
    code: str | None = None,
    type_: str | None = None,
) -> dict[str, Any]:
    """The OpenAI error envelope ``{"error": {"message", "type", "param", "code"}}``."""
    if type_ is None:
        type_ = "invalid_request_error" if status_code < 500 else "server_error"
    if code is None:
        code = guess_error_code(message, status_code)
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def guess_error_code(message: str, status_code: int) -> str | None:
    """OpenAI's error ``code`` for the common engine-side rejections, else None."""
    lowered = message.lower()
    if "context length" in lowered or "maximum context" in lowered or "too long" in lowered:
        return "context_length_exceeded"
    if status_code == 404 and "model" in lowered:
        return "model_not_found"
    return None
