"""One usage mapping (core.billing.token_usage) for both shapes: chat/completions/embeddings
(prompt/completion) and /v1/responses (input/output), in result lines and progress records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmbatch.core.billing import TokenUsage, token_usage
from llmbatch.storage import FilesystemStore
from llmbatch.storage.shardresults import ShardResults, read_progress, result_line

CHAT_USAGE = {
    "prompt_tokens": 11,
    "completion_tokens": 7,
    "total_tokens": 18,
    "prompt_tokens_details": {"cached_tokens": 4},
    "completion_tokens_details": {"reasoning_tokens": 2},
}
RESPONSES_USAGE = {
    "input_tokens": 20,
    "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 3},
    "total_tokens": 25,
}


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (CHAT_USAGE, TokenUsage(11, 7, 18, 4, 2)),
        (RESPONSES_USAGE, TokenUsage(20, 5, 25, 8, 3)),
        ({"prompt_tokens": 4, "total_tokens": 4}, TokenUsage(4, 0, 4)),  # embeddings
        ({"input_tokens": 3, "output_tokens": 2}, TokenUsage(3, 2, 5)),  # total from the parts
        ({"prompt_tokens": 0, "completion_tokens": 6}, TokenUsage(0, 6, 6)),
        ({"input_tokens": None, "output_tokens": 0}, TokenUsage()),
        ({"prompt_tokens": "9", "completion_tokens": -1, "total_tokens": True}, TokenUsage()),
        ({"input_tokens": 1, "input_tokens_details": None}, TokenUsage(1, 0, 1)),
        (
            {"output_tokens": 1, "output_tokens_details": {"reasoning_tokens": 2.5}},
            TokenUsage(0, 1, 1),
        ),
    ],
)
def test_both_usage_shapes_map_to_one_record(usage: dict[str, Any], expected: TokenUsage) -> None:
    assert token_usage({"usage": usage}) == expected


@pytest.mark.parametrize("body", [{}, {"usage": None}, {"usage": "nonsense"}, {"usage": [1]}])
def test_a_body_without_usage_counts_nothing(body: dict[str, Any]) -> None:
    assert token_usage(body) == TokenUsage()


def _line(cid: str, usage: dict[str, Any], status: int = 200) -> Any:
    body = {"object": "response", "usage": usage}
    return result_line(
        line_id=f"batch_req_{cid}", custom_id=cid, status_code=status, request_id="r", body=body
    )


def test_progress_counts_both_shapes_and_only_successes(tmp_path: Path) -> None:
    store = FilesystemStore(tmp_path)
    results = ShardResults(store, "shard", batch_id="batch_x", shard_index=0)
    results.recover()
    failed = _line("bad", RESPONSES_USAGE, status=500)
    assert failed.usage == TokenUsage()
    for line in (_line("chat", CHAT_USAGE), _line("resp", RESPONSES_USAGE), failed):
        results.add(line)
    results.commit(results.take_pending())
    progress = read_progress(store, "shard")
    assert progress is not None
    counted = (
        progress.input_tokens,
        progress.output_tokens,
        progress.total_tokens,
        progress.cached_tokens,
        progress.reasoning_tokens,
    )
    assert counted == (31, 12, 43, 12, 5)
    assert (progress.completed, progress.failed) == (2, 1)
    # A restarted executor re-reads the chunks and counts the same.
    again = ShardResults(store, "shard", batch_id="batch_x", shard_index=0)
    again.recover()
    assert again.progress.model_dump(include={"input_tokens", "cached_tokens"}) == {
        "input_tokens": 31,
        "cached_tokens": 12,
    }
    assert (again.progress.output_tokens, again.progress.reasoning_tokens) == (12, 5)
