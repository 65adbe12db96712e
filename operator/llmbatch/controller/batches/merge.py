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

from llmbatch.core.billing import token_usage
from llmbatch.core.keys import work_prefix
from llmbatch.core.lifecycle import never_run_line
from llmbatch.core.validation import iter_lines
from llmbatch.storage.base import ObjectNotFound, ObjectStore
from llmbatch.storage.shardresults import ChunkKind, list_chunks


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


class _Merge:
    """The state of one merge: custom_ids seen, the parts of each final file, the counts."""

    def __init__(self, store: ObjectStore, namespace: str, batch_uid: str, input_key: str) -> None:
        self.store = store
        self.batch_uid = batch_uid
        self.input_key = input_key
        self.final = f"{work_prefix(namespace, batch_uid)}/final"
        self.seen: set[str] = set()
        self.parts: dict[str, list[str]] = {"output": [], "errors": []}
        self.result = MergedResults(output_key=None, error_key=None)

    def add_chunk(self, kind: ChunkKind, key: str) -> None:
        """Count a chunk's lines not seen before; a chunk with duplicates is copied without
        them (the composed file must hold each custom_id once)."""
        kept: list[bytes] = []
        dropped = 0
        for raw in _lines(self.store.get(key)):
            line = orjson.loads(raw)
            if line["custom_id"] in self.seen:
                dropped += 1
                continue
            self.seen.add(line["custom_id"])
            kept.append(raw)
            if kind == "output":
                self._count_success(line)
            else:
                self.result.failed += 1
        if dropped:
            key = f"{self.final}/dedup/{key.rsplit('/', 2)[-2]}-{key.rsplit('/', 1)[-1]}"
            self.store.put(key, b"".join(raw + b"\n" for raw in kept))
        if kept:
            self.parts[kind].append(key)

    def _count_success(self, line: dict[str, object]) -> None:
        response = line.get("response")
        body = (response.get("body") if isinstance(response, dict) else None) or {}
        usage = token_usage(body)
        result = self.result
        result.completed += 1
        result.input_tokens += usage.input_tokens
        result.output_tokens += usage.output_tokens
        result.total_tokens += usage.total_tokens
        result.cached_tokens += usage.cached_tokens
        result.reasoning_tokens += usage.reasoning_tokens

    def add_never_run(self, shard: ShardOutcome) -> None:
        """An error line for every request of the shard's range that has no result."""
        try:
            chunks = self.store.iter_range(self.input_key, shard.start, shard.end)
        except ObjectNotFound:
            # Only a batch accepted before inputs were pinned to its work area can get here
            # (or bytes removed behind the operator's back): finish with what is known.
            self.result.input_missing = (
                "The input was deleted while the batch ran; requests that had not run by then "
                "are counted as failed but have no line in the error file."
            )
            return
        missing: list[bytes] = []
        for _, raw in iter_lines(chunks, shard.first_line):
            try:
                custom_id = orjson.loads(raw)["custom_id"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # validation guarantees this cannot happen
            if custom_id in self.seen:
                continue
            self.seen.add(custom_id)
            code, reason = shard.never_run_code, shard.reason
            missing.append(never_run_line(self.batch_uid, custom_id, code, reason))
        if missing:
            key = f"{self.final}/never-run-{shard.index:05d}.jsonl"
            self.store.put(key, b"".join(raw + b"\n" for raw in missing))
            self.parts["errors"].append(key)
            self.result.failed += len(missing)


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
    merge = _Merge(store, namespace, batch_uid, input_key)
    for shard in shards:
        for kind in ("output", "errors"):
            for key in list_chunks(store, shard.prefix, kind):
                merge.add_chunk(kind, key)
        merge.add_never_run(shard)
    result = merge.result
    if merge.parts["output"]:
        result.output_key = output_key
        result.output_bytes = store.compose(output_key, merge.parts["output"]).size
    if merge.parts["errors"]:
        result.error_key = error_key
        result.error_bytes = store.compose(error_key, merge.parts["errors"]).size
    return result
