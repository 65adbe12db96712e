"""An :class:`ObjectStore` that times every operation and counts failures into Prometheus
metrics the caller owns (each component has its own registry and metric names).

The ``op`` label is the method name, a fixed set. A missing key (:class:`ObjectNotFound`), a
lost conditional create (:class:`ObjectExists`) and a lost compare-and-swap
(:class:`ObjectChanged`) are answers, not failures; every other
:class:`StoreError` or ``OSError`` counts as an error. A stream's time is the time to open it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

from llmbatch.storage.base import (
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    Versioned,
)

T = TypeVar("T")
_ANSWERS = (ObjectNotFound, ObjectExists, ObjectChanged)
OPERATIONS = (
    "put",
    "put_if_match",
    "get",
    "get_versioned",
    "iter_range",
    "head",
    "list",
    "delete",
    "compose",
)


class InstrumentedStore(ObjectStore):
    """Delegates to ``inner``: ``seconds{op}`` times each call, ``errors{op}`` counts failures."""

    def __init__(self, inner: ObjectStore, seconds: Histogram, errors: Counter) -> None:
        self.inner = inner
        self._seconds = seconds
        self._errors = errors
        for op in OPERATIONS:  # every series from the start: rate() sees the first error
            errors.labels(op)

    def _timed(self, op: str, call: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return call()
        except _ANSWERS:
            raise
        except Exception:
            self._errors.labels(op).inc()
            raise
        finally:
            self._seconds.labels(op).observe(time.perf_counter() - started)

    def put(
        self,
        key: str,
        data: bytes | Iterable[bytes],
        *,
        if_absent: bool = False,
        sha256: str | None = None,
    ) -> ObjectInfo:
        return self._timed(
            "put", lambda: self.inner.put(key, data, if_absent=if_absent, sha256=sha256)
        )

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return self._timed("put_if_match", lambda: self.inner.put_if_match(key, data, version))

    def get_versioned(self, key: str) -> Versioned:
        return self._timed("get_versioned", lambda: self.inner.get_versioned(key))

    def atomic_if_absent(self) -> bool:
        return self.inner.atomic_if_absent()

    def atomic_if_match(self) -> bool:
        return self.inner.atomic_if_match()

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._timed("get", lambda: self.inner.get(key, start, end))

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        return self._timed("iter_range", lambda: self.inner.iter_range(key, start, end, chunk_size))

    def head(self, key: str) -> ObjectInfo | None:
        return self._timed("head", lambda: self.inner.head(key))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self._timed("list", lambda: self.inner.list(prefix))

    def delete(self, key: str) -> None:
        self._timed("delete", lambda: self.inner.delete(key))

    def compose(
        self,
        key: str,
        sources: Sequence[str | ObjectInfo],
        *,
        if_absent: bool = False,
        sha256: bool = False,
    ) -> ObjectInfo:
        return self._timed(
            "compose",
            lambda: self.inner.compose(key, sources, if_absent=if_absent, sha256=sha256),
        )

    def __getattr__(self, name: str) -> Any:
        # Backend extras (e.g. a filesystem store's root) stay reachable.
        return getattr(self.inner, name)
