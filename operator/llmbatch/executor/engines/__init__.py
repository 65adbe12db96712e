"""Engines behind one interface: ``vllm`` (in-process vLLM, OpenAI serving layer) and
``simulated`` (control-plane load tests only). vLLM is imported only when chosen."""

from __future__ import annotations

from llmbatch.api.shard import EngineSpec, ModelRef
from llmbatch.executor.engines.base import (
    Engine,
    EngineConfigError,
    EngineDead,
    EngineRequest,
    EngineResult,
    error_body,
)

__all__ = [
    "Engine",
    "EngineConfigError",
    "EngineDead",
    "EngineRequest",
    "EngineResult",
    "create_engine",
    "error_body",
]


def create_engine(engine: EngineSpec, model: ModelRef, served_names: list[str]) -> Engine:
    """The engine ``engine.name`` for ``model`` (not started yet)."""
    if engine.name == "simulated":
        from llmbatch.executor.engines.simulated import SimulatedEngine

        return SimulatedEngine(engine.args, served_names)
    if engine.name == "vllm":
        from llmbatch.executor.engines.vllm import VllmEngine

        return VllmEngine(engine.args, model, served_names, engine.media)
    raise EngineConfigError(f"unknown engine {engine.name!r}")
