"""Result chunks and the progress record of one shard.

Layout under the shard's ``output_prefix`` (``P``)::

    P/output-00000.jsonl   successful result lines (status 2xx)      immutable, created if absent
    P/output-00001.jsonl   ...
    P/errors-00000.jsonl   error lines (status >= 400, bad input lines)
    P/progress.json        summary the operator reads (rewritten after every chunk)

Each chunk object is created once (``if_absent``) and never changed, so a chunk is either wholly
committed or absent. The chunk objects are the truth; ``progress.json`` is a summary that can lag
one chunk behind them after a crash. A restarted executor lists the chunks, collects the
custom_ids they hold and skips those requests: nothing is done twice, nothing is lost.

Two executors running the same shard at once (a replaced pod still terminating) are safe too:
when a chunk name is taken, the writer reads every chunk it has not seen, drops the results the
other one already committed, and takes the next free number.

Under a lease every write is fenced (:class:`Fence`): a chunk or the progress record is written
only while the lease is still this run's, and the progress record is replaced only by a
compare-and-swap that refuses a record of a newer run — so a run that was paused while its
shard moved to another slot can never overwrite the new holder's progress. ``suspects.json``
holds the requests that were in the engine when it crashed (see :meth:`ShardResults.record_crash`)
and those the operator blamed for their slot's end (:func:`record_blame`: a slot killed for
memory with one request with media inside), which the next run answers with an error line.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from llmbatch.core.billing import TokenUsage, token_usage
from llmbatch.storage.base import (
    ObjectChanged,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    Versioned,
)

log = logging.getLogger(__name__)

ChunkKind = Literal["output", "errors"]
_KINDS: tuple[ChunkKind, ...] = ("output", "errors")
PROGRESS_NAME = "progress.json"
SUSPECTS_NAME = "suspects.json"
PROGRESS_VERSION = 1
#: Tries of one guarded progress write that lose a race to another writer before it gives up.
_PROGRESS_RACES = 8
_CHUNK_NAME = re.compile(r"^(output|errors)-(\d{5,})(?:-[0-9a-f]{8,32})?\.jsonl$")


def chunk_key(prefix: str, kind: ChunkKind, seq: int, writer: str | None = None) -> str:
    """``P/output-00003.jsonl``, or ``P/output-00003-<writer>.jsonl`` for a writer-unique key."""
    suffix = f"-{writer}" if writer else ""
    return f"{prefix}/{kind}-{seq:05d}{suffix}.jsonl"


def parse_chunk_key(prefix: str, key: str) -> tuple[ChunkKind, int] | None:
    """(kind, seq) of a chunk key directly under ``prefix``, else None."""
    if not key.startswith(prefix + "/"):
        return None
    match = _CHUNK_NAME.match(key[len(prefix) + 1 :])
    if match is None:
        return None
    kind: ChunkKind = "output" if match.group(1) == "output" else "errors"
    return kind, int(match.group(2))


class ChunkRecord(BaseModel):
    """One committed chunk object."""

    model_config = ConfigDict(extra="ignore")

    key: str
    kind: ChunkKind
    seq: int
    lines: int
    bytes: int
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    busy_seconds: float = 0.0
    """The busy-time shares of the requests answered in this chunk (their final attempts):
    known to the run that wrote the chunk, carried by the progress record after it."""

    def count(self, usage: TokenUsage) -> None:
        """Add one success's usage."""
        self.input_tokens += usage.input_tokens
        self.output_tokens += usage.output_tokens
        self.total_tokens += usage.total_tokens
        self.cached_tokens += usage.cached_tokens
        self.reasoning_tokens += usage.reasoning_tokens


class Progress(BaseModel):
    """``progress.json``: what the operator folds into the Batch status."""

    model_config = ConfigDict(extra="ignore")

    version: int = PROGRESS_VERSION
    batch_id: str
    shard_index: int
    state: Literal["running", "done", "preempted", "engine_failed", "failed"] = "running"
    done: bool = Field(default=False, description="Every request of the range has a result.")
    completed: int = Field(default=0, description="Lines in output chunks (successes).")
    failed: int = Field(default=0, description="Lines in error chunks.")
    input_tokens: int = Field(default=0, description="Input tokens of the successes.")
    output_tokens: int = Field(default=0, description="Output tokens of the successes.")
    total_tokens: int = 0
    cached_tokens: int = Field(default=0, description="Cached input tokens of the successes.")
    reasoning_tokens: int = Field(
        default=0, description="Reasoning output tokens of the successes."
    )
    chunks: list[ChunkRecord] = Field(default_factory=list)
    message: str | None = Field(default=None, description="Why the shard stopped, if not done.")
    started_at: float = 0.0
    updated_at: float = 0.0
    attempts: int = Field(default=1, description="Executor runs that worked on this shard.")
    busy_seconds: float = Field(
        default=0.0,
        description="The busy-time shares of the requests whose results are committed (the "
        "sum over its chunks): while n requests are in an engine each accrues 1/n of the time. "
        "Work whose result was never committed — cut off by a crash, a lost lease, the end of "
        "a drain — and failed attempts that were retried are not in it, so re-run work is "
        "charged once (GPU-time billing).",
    )
    generation: int = Field(
        default=0,
        description="The lease generation of the run that wrote this record: a run of an "
        "older generation never replaces it.",
    )


@dataclass
class ResultLine:
    """One serialized output/error line, ready for a chunk."""

    custom_id: str
    data: bytes
    ok: bool
    usage: TokenUsage = field(default_factory=TokenUsage)
    """What the success reports (``core.billing.token_usage``); zeros for an error line."""
    busy_seconds: float = 0.0
    """The request's share of its slot's busy time (the attempt that gave this answer)."""

    @property
    def input_tokens(self) -> int:
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int:
        return self.usage.output_tokens

    @property
    def total_tokens(self) -> int:
        return self.usage.total_tokens


def result_line(
    *,
    line_id: str,
    custom_id: str,
    status_code: int,
    request_id: str,
    body: dict[str, Any],
    busy_seconds: float = 0.0,
) -> ResultLine:
    """The contract's output line ``{"id","custom_id","response":{...},"error":null}``."""
    data = orjson.dumps(
        {
            "id": line_id,
            "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": request_id, "body": body},
            "error": None,
        }
    )
    ok = 200 <= status_code < 300
    usage = token_usage(body) if ok else TokenUsage()
    return ResultLine(custom_id, data + b"\n", ok, usage, busy_seconds)


@dataclass
class _Pending:
    lines: list[ResultLine] = field(default_factory=list)


class Fence(Protocol):
    """Whether the run may still write its shard (``storage.slotchannel.LeaseFence``)."""

    def lost(self) -> str | None:
        """None while the run holds its shard; else why not."""
        ...


class Fenced(Exception):
    """The shard is no longer this run's: nothing more may be written (not a store failure)."""


class CommitFailed(StoreError):
    """A chunk write failed; ``unwritten`` holds every line not committed (give it back with
    :meth:`ShardResults.restore`: a failed write never drops a result)."""

    def __init__(self, unwritten: dict[ChunkKind, list[ResultLine]], cause: Exception) -> None:
        super().__init__(f"chunk commit failed: {cause}")
        self.unwritten = unwritten
        self.cause = cause


class ShardResults:
    """The committed chunks of one shard plus the results not yet committed.

    Synchronous (store calls block); the async runner calls it through ``asyncio.to_thread``
    under one lock. ``add`` is cheap and may be called from the event loop at any time.
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        batch_id: str,
        shard_index: int,
        fence: Fence | None = None,
        generation: int = 0,
    ) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.fence = fence
        self.progress = Progress(batch_id=batch_id, shard_index=shard_index, generation=generation)
        self.done_ids: set[str] = set()
        self.suspects: dict[str, int] = {}
        """custom_id -> engine crashes it was in flight at (read at :meth:`recover`)."""
        self.blamed: dict[str, str] = {}
        """custom_id -> the error code it is answered with, not run (read at :meth:`recover`)."""
        self._known: dict[str, ChunkRecord] = {}
        self._next_seq: dict[ChunkKind, int] = {"output": 0, "errors": 0}
        self._pending: dict[ChunkKind, _Pending] = {"output": _Pending(), "errors": _Pending()}
        self._writer: str | None = None
        self._writer_known = False
        #: Busy shares of chunks committed before this run, by key (the previous record's).
        self._busy_of: dict[str, float] = {}

    @property
    def writer(self) -> str | None:
        """None, or this writer's own chunk-name token on a store whose create-if-absent is not
        atomic (S3 without conditional writes): two executors could both "create" one chunk key
        and the later put would replace the earlier chunk, so each writer names its chunks with
        its own random token and duplicates across writers are dropped by custom_id when chunks
        are scanned and merged. Asked of the store on first use (S3 probes it: a store call,
        made in the run's threads, never while the run is built)."""
        if not self._writer_known:
            self._writer = None if self.store.atomic_if_absent() else uuid.uuid4().hex[:16]
            self._writer_known = True
        return self._writer

    def check_fence(self) -> None:
        """Raise :class:`Fenced` when the shard is no longer this run's."""
        if self.fence is not None:
            why = self.fence.lost()
            if why is not None:
                raise Fenced(why)

    # --- reading what is committed -------------------------------------------------------------

    def recover(self) -> None:
        """Read every committed chunk, the previous progress record and the crash suspects
        (call once at start)."""
        previous = self._read_progress()
        now = time.time()
        self.progress.started_at = previous.started_at if previous else now
        self.progress.attempts = previous.attempts + 1 if previous else 1
        self._busy_of = {c.key: c.busy_seconds for c in previous.chunks} if previous else {}
        self.suspects, self.blamed = read_suspects(self.store, self.prefix)
        self._scan()

    def record_crash(self, custom_ids: set[str]) -> None:
        """Count one engine crash against every request that was in the engine then and has no
        result: the next run sends a suspect alone, and gives up on one that was in flight at
        too many crashes (fenced like every write)."""
        fresh = custom_ids - self.done_ids
        if not fresh:
            return
        for custom_id in fresh:
            self.suspects[custom_id] = self.suspects.get(custom_id, 0) + 1
        self.check_fence()
        _write_suspects(self.store, self.prefix, self.suspects, self.blamed)

    def _read_progress(self) -> Progress | None:
        key = f"{self.prefix}/{PROGRESS_NAME}"
        if self.store.head(key) is None:
            return None
        try:
            return Progress.model_validate_json(self.store.get(key))
        except ValueError:
            return None

    def _scan(self) -> set[str]:
        """Read chunks not seen yet; return the custom_ids they hold."""
        found: set[str] = set()
        for info in self.store.list(self.prefix + "/"):
            parsed = parse_chunk_key(self.prefix, info.key)
            if parsed is None or info.key in self._known:
                continue
            kind, seq = parsed
            record = ChunkRecord(key=info.key, kind=kind, seq=seq, lines=0, bytes=info.size)
            record.busy_seconds = self._busy_of.get(info.key, 0.0)
            for raw in self.store.get(info.key).splitlines():
                if not raw.strip():
                    continue
                line = orjson.loads(raw)
                found.add(line["custom_id"])
                record.lines += 1
                if kind == "output":
                    response = line.get("response") or {}
                    record.count(token_usage(response.get("body") or {}))
            self._known[info.key] = record
            self._next_seq[kind] = max(self._next_seq[kind], seq + 1)
        self.done_ids |= found
        self._recount()
        return found

    def _recount(self) -> None:
        p = self.progress
        records = sorted(self._known.values(), key=lambda r: (r.kind, r.seq))
        p.chunks = records
        p.completed = sum(r.lines for r in records if r.kind == "output")
        p.failed = sum(r.lines for r in records if r.kind == "errors")
        p.input_tokens = sum(r.input_tokens for r in records)
        p.output_tokens = sum(r.output_tokens for r in records)
        p.total_tokens = sum(r.total_tokens for r in records)
        p.cached_tokens = sum(r.cached_tokens for r in records)
        p.reasoning_tokens = sum(r.reasoning_tokens for r in records)
        p.busy_seconds = round(sum(r.busy_seconds for r in records), 3)

    # --- adding and committing -----------------------------------------------------------------

    def add(self, line: ResultLine) -> None:
        self._pending["output" if line.ok else "errors"].lines.append(line)

    @property
    def pending_count(self) -> int:
        return sum(len(p.lines) for p in self._pending.values())

    def take_pending(self) -> dict[ChunkKind, list[ResultLine]]:
        """Detach the uncommitted lines (call in the event loop, then :meth:`commit` them)."""
        taken = {kind: p.lines for kind, p in self._pending.items()}
        self._pending = {"output": _Pending(), "errors": _Pending()}
        return taken

    def restore(self, unwritten: dict[ChunkKind, list[ResultLine]]) -> None:
        """Put lines a failed :meth:`commit` did not write back in front of the pending ones."""
        for kind, lines in unwritten.items():
            self._pending[kind].lines[:0] = lines

    def commit(self, batch: dict[ChunkKind, list[ResultLine]]) -> None:
        """Write each non-empty kind as a new chunk, then rewrite the progress record.

        A failed chunk write raises :class:`CommitFailed` with every line not yet written; a
        failed progress write only logs (the chunks are the truth, the record catches up at the
        next commit and the final record is written by the runner).
        """
        wrote = False
        for position, kind in enumerate(_KINDS):
            lines: list[ResultLine] | None = batch.get(kind) or []
            while lines:
                try:
                    lines = self._write_chunk(kind, lines, batch)
                except Fenced:
                    if wrote:
                        self._recount()
                    raise
                except Exception as exc:
                    # A write that failed may still have landed (a timeout after the server
                    # stored it): the retry then finds the number taken and adopts the chunk.
                    if wrote:
                        self._recount()
                    unwritten: dict[ChunkKind, list[ResultLine]] = {kind: lines or []}
                    for later in _KINDS[position + 1 :]:
                        unwritten[later] = batch.get(later) or []
                    raise CommitFailed(unwritten, exc) from exc
                wrote = wrote or lines is None
        if wrote:
            self._recount()
            try:
                self.write_progress()
            except StoreError as exc:
                log.warning("%s: progress record not written (%s); chunks are", self.prefix, exc)

    def _write_chunk(
        self, kind: ChunkKind, lines: list[ResultLine], batch: dict[ChunkKind, list[ResultLine]]
    ) -> list[ResultLine] | None:
        """Write ``lines`` as the next chunk of ``kind``: None once written, else the lines still
        to write (another executor took the number: its results are dropped from ``batch``)."""
        seq = self._next_seq[kind]
        key = chunk_key(self.prefix, kind, seq, self.writer)
        data = b"".join(line.data for line in lines)
        self.check_fence()  # before every chunk, a retry after a taken name included
        try:
            info = self.store.put(key, data, if_absent=True)
        except ObjectExists:
            taken = self._scan()
            for other in _KINDS:
                rest = batch.get(other) or []
                batch[other] = [line for line in rest if line.custom_id not in taken]
            return [line for line in lines if line.custom_id not in taken]
        record = ChunkRecord(key=key, kind=kind, seq=seq, lines=len(lines), bytes=info.size)
        for line in lines:
            record.count(line.usage)
            record.busy_seconds += line.busy_seconds
        self._known[key] = record
        self._next_seq[kind] = seq + 1
        return None

    def write_progress(self, **changes: Any) -> None:
        """Rewrite the progress record; under a fence, only while the shard is this run's and
        never over a record written by a newer run (:class:`Fenced` then)."""
        for name, value in changes.items():
            setattr(self.progress, name, value)
        self.progress.updated_at = time.time()
        key = f"{self.prefix}/{PROGRESS_NAME}"
        body = self.progress.model_dump_json().encode()
        if self.fence is None:
            self.store.put(key, body)
            return
        self.check_fence()
        for _ in range(_PROGRESS_RACES):
            try:
                current: Versioned | None = self.store.get_versioned(key)
            except ObjectNotFound:
                current = None
            if current is not None:
                newer = _generation(current.data)
                if newer > self.progress.generation:
                    raise Fenced(f"progress of generation {newer} is newer than ours")
            try:
                if current is None:
                    self.store.put(key, body, if_absent=True)
                else:
                    self.store.put_if_match(key, body, current.version)
            except (ObjectExists, ObjectChanged):
                continue
            return
        raise StoreError(f"{key}: {_PROGRESS_RACES} writes in a row lost a race")


def _generation(data: bytes) -> int:
    """The run generation of a stored progress record (0 when unreadable or older)."""
    try:
        value = orjson.loads(data).get("generation", 0)
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return value if isinstance(value, int) else 0


def read_suspects(store: ObjectStore, prefix: str) -> tuple[dict[str, int], dict[str, str]]:
    """``suspects.json`` of the shard at ``prefix``: custom_id -> engine crashes it was in
    flight at, and custom_id -> the error code it is blamed with (empty when absent)."""
    try:
        raw = orjson.loads(store.get(f"{prefix.rstrip('/')}/{SUSPECTS_NAME}"))
    except ObjectNotFound:
        return {}, {}
    except orjson.JSONDecodeError:
        log.warning("%s: unreadable %s ignored", prefix, SUSPECTS_NAME)
        return {}, {}
    crashes = raw.get("crashes") if isinstance(raw, dict) else None
    blamed = raw.get("blamed") if isinstance(raw, dict) else None
    return (
        {str(k): v for k, v in crashes.items() if isinstance(v, int)}
        if isinstance(crashes, dict)
        else {},
        {str(k): v for k, v in blamed.items() if isinstance(v, str)}
        if isinstance(blamed, dict)
        else {},
    )


def record_blame(
    store: ObjectStore, prefix: str, blamed: dict[str, str], suspects: set[str]
) -> None:
    """The operator's verdict on a slot that ended under a shard's requests: ``blamed``
    (custom_id -> error code) are answered with that error by the next run, never run again;
    each of ``suspects`` counts one crash (run alone next time). Written while the shard's
    lease still names the lost slot, so no runner writes the record meanwhile."""
    crashes, known = read_suspects(store, prefix)
    for custom_id in suspects:
        crashes[custom_id] = crashes.get(custom_id, 0) + 1
    _write_suspects(store, prefix.rstrip("/"), crashes, {**known, **blamed})


def _write_suspects(
    store: ObjectStore, prefix: str, crashes: dict[str, int], blamed: dict[str, str]
) -> None:
    body = orjson.dumps({"version": 1, "crashes": crashes, "blamed": blamed})
    store.put(f"{prefix}/{SUSPECTS_NAME}", body)


def read_progress(store: ObjectStore, prefix: str) -> Progress | None:
    """The progress record of the shard at ``prefix`` (for the operator), or None."""
    key = f"{prefix.rstrip('/')}/{PROGRESS_NAME}"
    if store.head(key) is None:
        return None
    return Progress.model_validate_json(store.get(key))


def list_chunks(store: ObjectStore, prefix: str, kind: ChunkKind) -> list[str]:
    """Keys of the committed chunks of ``kind`` under ``prefix``, in commit order."""
    prefix = prefix.rstrip("/")
    found: list[tuple[int, str]] = []
    for info in store.list(prefix + "/"):
        parsed = parse_chunk_key(prefix, info.key)
        if parsed is not None and parsed[0] == kind:
            found.append((parsed[1], info.key))
    return [key for _, key in sorted(found)]
