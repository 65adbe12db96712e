"""The operator's model_not_found error fits status.errors whatever model a line names."""

from __future__ import annotations

import pathlib

import orjson

from llmbatch.api.resources import ValidationError
from llmbatch.core import keys
from tests.fixtures.builders import TENANT, make_batch, make_input_file
from tests.fixtures.reconciler import ReconcilerHarness

BATCH = "batch-0123456789abcdef01234567"
FILE = "file-00000000000000000000000000000001"


def test_a_huge_model_name_is_cut_in_the_message(tmp_path: pathlib.Path) -> None:
    h = ReconcilerHarness(tmp_path)  # no pool serves anything
    batch_file = make_input_file(h.store, FILE, 0)
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m" * 100_000, "messages": [{"role": "user", "content": "hi"}]},
    }
    h.store.put(keys.file_key(TENANT, FILE), orjson.dumps(line) + b"\n")
    h.kube.add("batchfiles", batch_file)
    h.kube.add("batches", make_batch(BATCH, input_file_id=FILE))
    status = h.step_until(BATCH, "failed")
    (error,) = status["errors"]
    assert error["code"] == "model_not_found"
    assert "m" * 256 + "…" in error["message"]
    ValidationError.model_validate(error)  # what status.errors[] takes (4096 characters)
