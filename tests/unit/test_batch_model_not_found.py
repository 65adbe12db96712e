"""The operator's model_not_found error fits status.errors whatever model a line names."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from llmbatch.api.resources import BatchSpec, ValidationError
from llmbatch.controller.batches import BatchReconciler, Rejected
from llmbatch.controller.config import OperatorConfig


class NoPools:
    async def list_custom(self, plural: str, namespace: str | None = None) -> list[Any]:
        return []


def test_a_huge_model_name_is_cut_in_the_message() -> None:
    config = OperatorConfig(store_uri="file:///nowhere", executor_store_uri="file:///nowhere")
    reconciler = BatchReconciler(NoPools(), store=None, config=config)  # type: ignore[arg-type]
    spec = BatchSpec.model_validate({"endpoint": "/v1/chat/completions", "inputFileID": "f"})
    with pytest.raises(Rejected) as rejected:
        asyncio.run(reconciler._choose_pool(spec, "m" * 100_000))
    (error,) = rejected.value.errors
    assert error["code"] == "model_not_found"
    assert "m" * 256 + "…" in error["message"]
    ValidationError.model_validate(error)  # what status.errors[] takes (4096 characters)
