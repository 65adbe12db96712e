"""Result chunks and the progress record: commit, resume, concurrent writers."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Iterator

import orjson
import pytest

from llmbatch.core.billing import TokenUsage, token_usage
from llmbatch.storage.base import (
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    Versioned,
)
from llmbatch.storage.shardresults import (
    ShardResults,
    chunk_key,
    list_chunks,
    parse_chunk_key,
    read_progress,
    result_line,
)


class MemoryStore(ObjectStore):
    """A dict-backed store for unit tests."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.puts: list[str] = []

    def put(
        self, key: str, data: bytes | Iterable[bytes], *, if_absent: bool = False
    ) -> ObjectInfo:
        payload = data if isinstance(data, bytes) else b"".join(data)
        with self.lock:
            if if_absent and key in self.objects:
                raise ObjectExists(key)
            self.objects[key] = payload
            self.puts.append(key)
        return ObjectInfo(key=key, size=len(payload))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        try:
            return self.objects[key][start:end]
        except KeyError:
            raise ObjectNotFound(key) from None

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        data = self.get(key, start, end)
        for i in range(0, len(data), chunk_size):
            yield data[i : i + chunk_size]

    def head(self, key: str) -> ObjectInfo | None:
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(key=key, size=len(data))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        for key in sorted(self.objects):
            if key.startswith(prefix):
                yield ObjectInfo(key=key, size=len(self.objects[key]))

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def compose(self, key: str, sources: list[str]) -> ObjectInfo:
        return self.put(key, b"".join(self.objects[s] for s in sources))

    def get_versioned(self, key: str) -> Versioned:
        data = self.get(key)
        return Versioned(data, hashlib.sha256(data).hexdigest())

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        with self.lock:
            current = self.objects.get(key)
            if current is None or hashlib.sha256(current).hexdigest() != version:
                raise ObjectChanged(key)
            self.objects[key] = data
            self.puts.append(key)
        return ObjectInfo(key=key, size=len(data))


def _line(custom_id: str, status: int = 200, tokens: tuple[int, int] = (3, 5)):
    body = (
        {"usage": {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}}
        if status == 200
        else {"error": {"message": "x", "type": "invalid_request_error"}}
    )
    return result_line(
        line_id=f"batch_req_{custom_id}",
        custom_id=custom_id,
        status_code=status,
        request_id=f"req_{custom_id}",
        body=body,
    )


def _results(store: ObjectStore, prefix: str = "b/shards/00000") -> ShardResults:
    results = ShardResults(store, prefix, batch_id="batch_1", shard_index=0)
    results.recover()
    return results


def _ids(store: MemoryStore, kind: str, prefix: str = "b/shards/00000") -> list[str]:
    ids = []
    for key in list_chunks(store, prefix, kind):  # type: ignore[arg-type]
        ids += [orjson.loads(raw)["custom_id"] for raw in store.get(key).splitlines()]
    return ids


def test_chunk_names_round_trip() -> None:
    key = chunk_key("p/q", "output", 7)
    assert key == "p/q/output-00007.jsonl"
    assert parse_chunk_key("p/q", key) == ("output", 7)
    assert parse_chunk_key("p/q", "p/q/progress.json") is None
    assert parse_chunk_key("p/q", "p/qq/output-00001.jsonl") is None
    assert parse_chunk_key("p", "p/q/output-00001.jsonl") is None


def test_result_line_follows_the_contract() -> None:
    line = _line("a")
    assert line.ok
    assert line.data.endswith(b"\n")
    parsed = orjson.loads(line.data)
    assert parsed == {
        "id": "batch_req_a",
        "custom_id": "a",
        "response": {
            "status_code": 200,
            "request_id": "req_a",
            "body": {"usage": {"prompt_tokens": 3, "completion_tokens": 5}},
        },
        "error": None,
    }
    assert (line.input_tokens, line.output_tokens, line.total_tokens) == (3, 5, 8)
    bad = _line("b", status=400)
    assert not bad.ok
    assert bad.total_tokens == 0


def test_usage_of_embeddings_and_missing() -> None:
    embeddings = token_usage({"usage": {"prompt_tokens": 4, "total_tokens": 4}})
    assert (embeddings.input_tokens, embeddings.output_tokens, embeddings.total_tokens) == (4, 0, 4)
    assert token_usage({}) == token_usage({"usage": "nonsense"}) == TokenUsage()


def test_commit_writes_immutable_chunks_and_progress() -> None:
    store = MemoryStore()
    results = _results(store)
    for cid in ("a", "b"):
        results.add(_line(cid))
    results.add(_line("c", status=400))
    results.commit(results.take_pending())
    results.add(_line("d"))
    results.commit(results.take_pending())
    assert list_chunks(store, "b/shards/00000", "output") == [
        "b/shards/00000/output-00000.jsonl",
        "b/shards/00000/output-00001.jsonl",
    ]
    assert _ids(store, "errors") == ["c"]
    progress = read_progress(store, "b/shards/00000")
    assert progress is not None
    assert (progress.completed, progress.failed) == (3, 1)
    assert (progress.input_tokens, progress.output_tokens, progress.total_tokens) == (9, 15, 24)
    assert len(progress.chunks) == 3
    assert not progress.done


def test_empty_commit_writes_nothing() -> None:
    store = MemoryStore()
    results = _results(store)
    results.commit(results.take_pending())
    assert store.objects == {}


def test_recover_counts_committed_chunks_and_skips_their_ids() -> None:
    store = MemoryStore()
    first = _results(store)
    for cid in ("a", "b", "c"):
        first.add(_line(cid, status=200 if cid != "b" else 500))
    first.commit(first.take_pending())
    # progress.json lost or stale: the chunks are the truth
    store.delete("b/shards/00000/progress.json")
    second = _results(store)
    assert second.done_ids == {"a", "b", "c"}
    assert (second.progress.completed, second.progress.failed) == (2, 1)
    second.add(_line("d"))
    second.commit(second.take_pending())
    assert _ids(store, "output") == ["a", "c", "d"]
    progress = read_progress(store, "b/shards/00000")
    assert progress is not None
    assert progress.completed == 3


def test_attempts_are_counted() -> None:
    store = MemoryStore()
    _results(store).write_progress()
    results = _results(store)
    assert results.progress.attempts == 2


def test_concurrent_writer_conflict_drops_duplicates() -> None:
    store = MemoryStore()
    a = _results(store)
    b = _results(store)
    a.add(_line("x"))
    a.add(_line("y"))
    a.commit(a.take_pending())
    # b started before a committed; it also finished "y" (a replaced pod doing the same work)
    b.add(_line("y"))
    b.add(_line("z"))
    b.commit(b.take_pending())
    ids = _ids(store, "output")
    assert sorted(ids) == ["x", "y", "z"]
    assert len(ids) == len(set(ids))
    assert b.progress.completed == 3


@pytest.mark.parametrize("kind", ["output", "errors"])
def test_every_line_reaches_one_chunk(kind: str) -> None:
    store = MemoryStore()
    results = _results(store)
    status = 200 if kind == "output" else 404
    for i in range(25):
        results.add(_line(f"r{i}", status=status))
        if i % 7 == 6:
            results.commit(results.take_pending())
    results.commit(results.take_pending())
    assert _ids(store, kind) == [f"r{i}" for i in range(25)]
