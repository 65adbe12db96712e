"""Streaming ``POST /v1/files``: multipart parsed incrementally, validated line by line, stored.

The request body is read chunk by chunk (``request.stream()``) into ``python_multipart``'s push
parser; the bytes of the ``file`` part go, in ~1 MiB pieces through a bounded pipe, to a worker
thread that feeds them to the line validator and on into ``ObjectStore.put`` (which streams too).
Memory stays bounded by a few MiB whatever the file size. The first bad line stops the write (the
store never publishes a partial object) and answers 400 naming the line; a body over the cap
answers 413 without reading the rest, and a body that ends before its closing boundary answers
400 (nothing is published: a body cut at a line boundary is not a shorter, valid file).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from python_multipart import MultipartParser
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request

from llmbatch.core.validation import ValidationLimits, ValidationResult
from llmbatch.gateway.errors import APIError
from llmbatch.gateway.uploadcheck import (
    DEFAULT_ENDPOINT,
    BadLine,
    UploadChecker,
    bad_line_error,
    expires_after_problem,
    expires_after_seconds,
)
from llmbatch.storage import ObjectInfo, ObjectStore

HANDOFF_BYTES = 1 << 20
PIPE_DEPTH = 4
MAX_FIELD_BYTES = 4096
MAX_FIELDS = 16  # form fields kept (only 'purpose' and expires_after are read); more are ignored
MAX_PART_HEADERS = 8
MAX_PART_HEADER_BYTES = 4096 + 128  # one header line; filenames are cut to 512 characters anyway
MULTIPART_OVERHEAD = 64 * 1024
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="upload")
_STORE_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="store")
_ABORT = object()
_END = object()


class _Aborted(Exception):
    """The request side gave up (size cap, client gone, bad form); nothing may be published."""


@dataclass
class StoredUpload:
    info: ObjectInfo
    result: ValidationResult
    endpoint: str


class _Pipe:
    """Bounded hand-off of chunks from the event loop to one worker thread.

    A plain ``queue.Queue``: the worker blocks on it without waking the event loop per chunk; the
    loop side only polls (briefly sleeping) while the queue is full.
    """

    def __init__(self) -> None:
        self.queue: queue.Queue[object] = queue.Queue(maxsize=PIPE_DEPTH)
        self.future: asyncio.Future[Any] | None = None

    async def send(self, item: object) -> bool:
        """Queue ``item``; False when the worker has already stopped."""
        assert self.future is not None
        delay = 0.0005
        while True:
            if self.future.done():
                return False
            try:
                self.queue.put_nowait(item)
                return True
            except queue.Full:
                await asyncio.wait({self.future}, timeout=delay)
                delay = min(delay * 2, 0.01)

    def abort(self) -> None:
        while True:  # make room: the worker stops at the marker and reads no further
            try:
                self.queue.put_nowait(_ABORT)
                return
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self.queue.get_nowait()

    def receive(self) -> Iterator[bytes]:
        """Worker side: the chunks until the end marker (raises :class:`_Aborted` on abort)."""
        while True:
            item = self.queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Aborted
            assert isinstance(item, bytes)
            yield item


class MultipartUpload:
    """Reads one multipart upload request; see the module docstring."""

    def __init__(
        self,
        request: Request,
        store: ObjectStore,
        key: str,
        max_bytes: int,
        limits_for: Callable[[ValidationLimits, str | None], ValidationLimits] | None = None,
        *,
        over: APIError | None = None,
    ) -> None:
        self.request = request
        self.store = store
        self.key = key
        self.max_bytes = max_bytes
        self.over = over
        """The answer to a file past ``max_bytes`` (default: 413 ``file_too_large``)."""
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.expires_after: int | None = None
        """The lifetime the form's expires_after asks for (set once the body is complete)."""
        self.file_bytes = 0
        self.file_parts = 0
        self._pipe: _Pipe | None = None
        self._checker = UploadChecker(
            ValidationLimits(max_bytes=max_bytes, max_requests=50_000), limits_for
        )
        self._pending = bytearray()
        self._part: str | None = None  # "file", a field name, or "" (ignored)
        self._field = bytearray()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[bytes, bytes] = {}
        self._error: APIError | None = None
        self._result: ValidationResult | None = None
        self._complete = False  # the closing boundary arrived

    # --- parser callbacks ----------------------------------------------------------------------

    def _on_part_begin(self) -> None:
        self._headers = {}
        self._part = None

    def _on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _on_header_end(self) -> None:
        self._headers[bytes(self._header_field).lower()] = bytes(self._header_value)
        self._header_field = bytearray()
        self._header_value = bytearray()

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        if name == "file":
            self.file_parts += 1
            if self.file_parts > 1:
                self._fail(
                    APIError(400, "Only one file may be uploaded per request.", param="file")
                )
                self._part = ""
                return
            raw_name = options.get(b"filename")
            self.filename = _clean_filename(
                raw_name.decode("utf-8", "replace") if raw_name is not None else "upload.jsonl"
            )
            self._part = "file"
        elif name in self.fields or len(self.fields) < MAX_FIELDS:
            self._part = name
            self._field = bytearray()
        else:
            self._part = ""

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part == "file":
            self._pending += memoryview(data)[start:end]
            self.file_bytes += end - start
        elif self._part:
            if len(self._field) + (end - start) > MAX_FIELD_BYTES:
                self._fail(
                    APIError(400, f"Form field {self._part!r} is too long.", param=self._part)
                )
                self._part = ""
                return
            self._field += data[start:end]

    def _on_part_end(self) -> None:
        if self._part and self._part != "file":
            value = self._field.decode("utf-8", "replace")
            self.fields.setdefault(self._part, value)
            if self._part.startswith("expires_after"):
                problem = expires_after_problem(self._part, value)
                if problem is not None:
                    self._fail(problem)
            if self._part == "purpose" and value != "batch":
                self._fail(
                    APIError(
                        400,
                        f"Invalid value for 'purpose': {value[:64]!r}. This gateway accepts "
                        "only 'batch' uploads.",
                        param="purpose",
                        code="invalid_value",
                    )
                )

    def _on_end(self) -> None:
        self._complete = True

    def _fail(self, error: APIError) -> None:
        if self._error is None:
            self._error = error

    # --- driving -------------------------------------------------------------------------------

    def _too_large(self) -> APIError:
        if self.over is not None:
            return self.over
        return APIError(
            413,
            f"File is too large: the limit is {self.max_bytes} bytes.",
            param="file",
            code="file_too_large",
        )

    def _parser(self) -> MultipartParser:
        content_type = self.request.headers.get("content-type", "")
        kind, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if kind != b"multipart/form-data" or not boundary:
            raise APIError(
                400,
                "Uploads must be multipart/form-data with a 'file' and a 'purpose' field.",
                param="file",
                code="invalid_content_type",
            )
        callbacks: Any = {
            "on_part_begin": self._on_part_begin,
            "on_part_data": self._on_part_data,
            "on_part_end": self._on_part_end,
            "on_header_field": self._on_header_field,
            "on_header_value": self._on_header_value,
            "on_header_end": self._on_header_end,
            "on_headers_finished": self._on_headers_finished,
            "on_end": self._on_end,
        }
        return MultipartParser(
            boundary,
            callbacks,
            max_header_count=MAX_PART_HEADERS,
            max_header_size=MAX_PART_HEADER_BYTES,
        )

    def _write(self, pipe: _Pipe) -> StoredUpload:
        """Worker thread: validate, and hand the bytes on to a second thread that stores them.

        Two stages so that hashing, writing and fsync (which release the GIL) overlap with the
        validator instead of queueing behind it.
        """
        stage: queue.Queue[object] = queue.Queue(maxsize=PIPE_DEPTH)

        def stored_chunks() -> Iterator[bytes]:
            while True:
                item = stage.get()
                if item is _END:
                    return
                if item is _ABORT:
                    raise _Aborted
                assert isinstance(item, bytes)
                yield item

        writer = _STORE_EXECUTOR.submit(self.store.put, self.key, stored_chunks())

        def forward(item: object) -> None:
            while True:
                try:
                    stage.put(item, timeout=0.1)
                    return
                except queue.Full:
                    if writer.done():
                        writer.result()  # raises the store's error
                        raise _Aborted from None

        try:
            for chunk in pipe.receive():
                self._checker.feed(chunk)
                forward(chunk)
            self._result = self._checker.finish()
        except BaseException:
            with contextlib.suppress(BaseException):
                forward(_ABORT)
            with contextlib.suppress(BaseException):
                writer.result()
            raise
        forward(_END)
        info = writer.result()
        return StoredUpload(info, self._result, self._checker.endpoint or DEFAULT_ENDPOINT)

    def _start_writer(self) -> _Pipe:
        pipe = self._pipe = _Pipe()
        pipe.future = asyncio.get_running_loop().run_in_executor(_EXECUTOR, self._write, pipe)
        return pipe

    async def _flush(self, final: bool = False) -> bool:
        """Hand buffered file bytes to the worker; False when it stopped (a bad line)."""
        if not self._pending or (not final and len(self._pending) < HANDOFF_BYTES):
            return True
        pipe = self._pipe or self._start_writer()
        chunk, self._pending = bytes(self._pending), bytearray()
        return await pipe.send(chunk)

    async def run(self) -> StoredUpload | None:
        """Read the whole request; the stored upload (None when no file part came)."""
        length = self.request.headers.get("content-length")
        if length and length.isdigit() and int(length) > self.max_bytes + MULTIPART_OVERHEAD:
            raise self._too_large()
        parser = self._parser()
        try:
            writer_alive = await self._read(parser)
            self._check_complete(parser)
            if self.file_parts == 0:
                return None
            return await self._finish(writer_alive)
        except ClientDisconnect as exc:
            raise APIError(400, "The client closed the upload early.", param="file") from exc
        finally:
            running = self._pipe
            if running is not None and running.future is not None and not running.future.done():
                running.abort()
                with contextlib.suppress(BaseException):  # the abort's own _Aborted
                    await running.future

    async def _read(self, parser: MultipartParser) -> bool:
        """Parse the body as it arrives; False once the writer stopped (a bad line)."""
        received = 0
        writer_alive = True
        async for data in self.request.stream():
            received += len(data)
            if received > self.max_bytes + MULTIPART_OVERHEAD or self.file_bytes > self.max_bytes:
                raise self._too_large()
            if not data:
                continue
            try:
                parser.write(data)
            except MultipartParseError as exc:
                raise _malformed(exc) from exc
            if self.file_bytes > self.max_bytes:
                raise self._too_large()
            if writer_alive and self._error is None:
                writer_alive = await self._flush()
            else:
                self._pending = bytearray()  # draining after a bad line
        return writer_alive

    def _check_complete(self, parser: MultipartParser) -> None:
        try:
            parser.finalize()
        except MultipartParseError as exc:
            raise _malformed(exc) from exc
        if self._error is not None:
            raise self._error
        # Both parts or neither, checked before the store publishes anything.
        self.expires_after = expires_after_seconds(self.fields)
        if not self._complete:
            # python_multipart does not check this: a body cut short (at a line boundary, say)
            # would otherwise be stored as a complete, shorter file.
            raise APIError(
                400,
                "The multipart body ended before its closing boundary: the upload is "
                "incomplete, nothing was stored.",
                param="file",
                code="invalid_body",
            )

    async def _finish(self, writer_alive: bool) -> StoredUpload:
        """Hand over the last bytes and wait for the validator's verdict and the store."""
        if writer_alive:
            writer_alive = await self._flush(final=True)
        pipe = self._pipe or self._start_writer()  # an empty file is validated (rejected) too
        if writer_alive:
            await pipe.send(_END)
        assert pipe.future is not None
        try:
            return await pipe.future  # type: ignore[no-any-return]
        except BadLine as bad:
            raise bad_line_error(bad.problem) from bad


def _malformed(exc: MultipartParseError) -> APIError:
    return APIError(400, f"Malformed multipart body: {exc}", param="file", code="invalid_body")


def _clean_filename(name: str) -> str:
    base = re.split(r"[\\/]", name)[-1].strip()
    base = "".join(ch for ch in base if ch.isprintable())
    return (base or "upload.jsonl")[:512]
