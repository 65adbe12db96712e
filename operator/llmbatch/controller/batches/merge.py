"""Finalisation: merge shard chunks into one output and one error file, account for every request.

Idempotent: keys and file ids are derived from the batch uid, so running it twice (an operator
restart mid-way) writes the same objects. Every input request ends up in exactly one of the two
files: results are de-duplicated by custom_id (a replaced pod may have committed a result twice),
and a request with no result gets a ``batch_expired`` / ``batch_cancelled`` / ``shard_failed``
line. Usage is summed from the final, de-duplicated output, so each success is billed once.
Synchronous: the operator runs it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from llmbatch.core.keys import work_prefix
from llmbatch.core.lifecycle import never_run_line
from llmbatch.core.validation import iter_lines
from llmbatch.storage.base import ObjectNotFound, ObjectStore
from llmbatch.storage.shardresults import ChunkKind, list_chunks, usage_of


@dataclass(frozen=True)
class ShardOutcome:
    """What finalisation needs to know of one shard."""

    index: int
    prefix: str
    start: int
    end: int
    first_line: int
    never_run_code: str
    """Code for this shard's requests without a result: batch_expired, batch_cancelled, ..."""
    reason: str = ""


@dataclass
class MergedResults:
    """The final files and the numbers that go on the Batch status."""

    output_key: str | None
    error_key: str | None
    output_bytes: int = 0
    error_bytes: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    total_tokens: int = 0
    input_missing: str | None = None
    """Why requests without a result have no error line: the input could not be read."""


def _lines(data: bytes) -> Iterable[bytes]:
    return (line for line in data.split(b"\n") if line.strip())


def _usage_details(body: dict[str, object]) -> tuple[int, int]:
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return 0, 0
    prompt = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
    cached = prompt.get("cached_tokens") if isinstance(prompt, dict) else 0
    reasoning = completion.get("reasoning_tokens") if isinstance(completion, dict) else 0
    return (
        cached if isinstance(cached, int) else 0,
        reasoning if isinstance(reasoning, int) else 0,
    )


def merge_shard_outputs(
    store: ObjectStore,
    *,
    namespace: str,
    batch_uid: str,
    input_key: str,
    shards: list[ShardOutcome],
    output_key: str,
    error_key: str,
) -> MergedResults:
    """Write the final output and error files of a batch; see the module docstring."""
    final = f"{work_prefix(namespace, batch_uid)}/final"
    seen: set[str] = set()
    parts: dict[str, list[str]] = {"output": [], "errors": []}
    result = MergedResults(output_key=None, error_key=None)
    for shard in shards:
        kinds: tuple[ChunkKind, ...] = ("output", "errors")
        for kind in kinds:
            for key in list_chunks(store, shard.prefix, kind):
                data = store.get(key)
                kept: list[bytes] = []
                dropped = 0
                for raw in _lines(data):
                    line = orjson.loads(raw)
                    custom_id = line["custom_id"]
                    if custom_id in seen:
                        dropped += 1
                        continue
                    seen.add(custom_id)
                    kept.append(raw)
                    if kind == "output":
                        result.completed += 1
                        body = (line.get("response") or {}).get("body") or {}
                        i, o, t = usage_of(body)
                        cached, reasoning = _usage_details(body)
                        result.input_tokens += i
                        result.output_tokens += o
                        result.total_tokens += t
                        result.cached_tokens += cached
                        result.reasoning_tokens += reasoning
                    else:
                        result.failed += 1
                if dropped:
                    # Rewrite the chunk without the duplicates; compose the copy instead.
                    key = f"{final}/dedup/{key.rsplit('/', 2)[-2]}-{key.rsplit('/', 1)[-1]}"
                    store.put(key, b"".join(raw + b"\n" for raw in kept))
                if kept:
                    parts[kind].append(key)
        # Requests of the shard's range with no result at all never ran.
        missing: list[bytes] = []
        try:
            chunks = store.iter_range(input_key, shard.start, shard.end)
        except ObjectNotFound:
            # Only a batch accepted before inputs were pinned to its work area can get here
            # (or bytes removed behind the operator's back): finish with what is known.
            result.input_missing = (
                "The input was deleted while the batch ran; requests that had not run by then "
                "are counted as failed but have no line in the error file."
            )
            continue
        for _, raw in iter_lines(chunks, shard.first_line):
            try:
                custom_id = orjson.loads(raw)["custom_id"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # validation guarantees this cannot happen
            if custom_id in seen:
                continue
            seen.add(custom_id)
            missing.append(never_run_line(batch_uid, custom_id, shard.never_run_code, shard.reason))
        if missing:
            key = f"{final}/never-run-{shard.index:05d}.jsonl"
            store.put(key, b"".join(raw + b"\n" for raw in missing))
            parts["errors"].append(key)
            result.failed += len(missing)
    if parts["output"]:
        result.output_key = output_key
        result.output_bytes = store.compose(output_key, parts["output"]).size
    if parts["errors"]:
        result.error_key = error_key
        result.error_bytes = store.compose(error_key, parts["errors"]).size
    return result
