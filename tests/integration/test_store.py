"""The ObjectStore contract, run against both backends (``store`` is parametrized), plus each
backend's own guarantees. S3 runs against a real versitygw server process
(tests/fixtures/s3server.py).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import ClientError, ResponseStreamingError
from hypothesis import given, settings
from hypothesis import strategies as st

from llmbatch.storage import (
    FilesystemStore,
    IntegrityError,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    open_store,
)
from llmbatch.storage.s3 import S3Store
from tests.fixtures.s3server import S3Server

MIB = 1 << 20


def _pattern(size: int, seed: int = 0) -> bytes:
    """Deterministic non-repeating-looking bytes (so misplaced ranges are caught)."""
    block = hashlib.sha256(f"{seed}".encode()).digest() * 2048  # 64 KiB
    reps = size // len(block) + 1
    data = b"".join(bytes([(i + seed) % 251]) + block[1:] for i in range(reps))
    return data[:size]


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _count_calls(store: ObjectStore, method: str, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the calls an S3Store makes to one boto3 client method."""
    calls: list[Any] = []
    assert isinstance(store, S3Store)
    original: Callable[..., Any] = getattr(store.client, method)

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(store.client, method, spy)
    return calls


def _corrupt(store: ObjectStore, key: str, data: bytes) -> None:
    """Change an object's bytes behind the store's back (no new checksum recorded)."""
    if isinstance(store, FilesystemStore):
        with open(store.root / key, "r+b") as f:
            f.write(data)
    else:
        assert isinstance(store, S3Store)
        store.client.put_object(Bucket=store.bucket, Key=store.prefix + key, Body=data)


# -- put / get ---------------------------------------------------------------------------------


def test_put_get_bytes(store: ObjectStore) -> None:
    info = store.put("a/b/obj.jsonl", b'{"x": 1}\n')
    assert info == ObjectInfo(
        key="a/b/obj.jsonl",
        size=9,
        sha256=hashlib.sha256(b'{"x": 1}\n').hexdigest(),
        etag=info.etag,
    )
    assert store.get("a/b/obj.jsonl") == b'{"x": 1}\n'
    head = store.head("a/b/obj.jsonl")
    assert head is not None
    assert head.size == 9


def test_put_stream_and_overwrite(store: ObjectStore) -> None:
    store.put("k", iter([b"hello", b"", b" ", b"world"]))
    assert store.get("k") == b"hello world"
    first = store.head("k")
    info = store.put("k", b"second")
    assert store.get("k") == b"second"
    assert info.size == 6
    head = store.head("k")
    assert first is not None
    assert head is not None
    assert info.etag is not None
    assert head.etag == info.etag != first.etag  # etags tell versions apart
    assert [i.etag for i in store.list("k")] == [info.etag]


def test_put_empty_object(store: ObjectStore) -> None:
    info = store.put("empty", iter([]))
    assert info.size == 0
    assert info.sha256 == hashlib.sha256(b"").hexdigest()
    assert store.get("empty") == b""
    assert store.get("empty", 0, 10) == b""
    assert list(store.iter_range("empty")) == []
    head = store.head("empty")
    assert head is not None
    assert head.size == 0


def test_put_records_sha256_and_rejects_mismatch(store: ObjectStore) -> None:
    data = b"payload" * 100
    digest = hashlib.sha256(data).hexdigest()
    assert store.put("ok", data, sha256=digest).sha256 == digest
    head = store.head("ok")
    assert head is not None
    if head.sha256 is not None:  # filesystems without user xattrs record none
        assert head.sha256 == digest
    with pytest.raises(IntegrityError):
        store.put("bad", data, sha256="0" * 64)
    assert store.head("bad") is None


def test_large_multipart_put_stream(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _pattern(12 * MIB + 123, seed=1)
    parts = _count_calls(store, "upload_part", monkeypatch) if isinstance(store, S3Store) else []
    info = store.put("big/stream.bin", _chunks(data, 700_000))
    assert info.size == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    if isinstance(store, S3Store):
        assert len(parts) == 2  # 8 MiB + the rest
        assert all(len(p["Body"]) >= 5 * MIB for p in parts[:-1])
    head = store.head("big/stream.bin")
    assert head is not None
    assert head.size == len(data)
    assert store.get("big/stream.bin") == data
    # A range across the part boundary.
    boundary = 8 * MIB
    assert (
        store.get("big/stream.bin", boundary - 10, boundary + 10)
        == data[boundary - 10 : boundary + 10]
    )


def test_large_put_from_one_bytes_object_is_split(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _pattern(12 * MIB, seed=2)
    parts = _count_calls(store, "upload_part", monkeypatch) if isinstance(store, S3Store) else []
    store.put("big/bytes.bin", data, sha256=hashlib.sha256(data).hexdigest())
    if isinstance(store, S3Store):
        assert [len(p["Body"]) for p in parts] == [8 * MIB, 4 * MIB]
        head = store.head("big/bytes.bin")
        assert head is not None
        assert head.sha256 == hashlib.sha256(data).hexdigest()  # known up front: recorded
    assert store.get("big/bytes.bin") == data


def test_failed_stream_leaves_nothing(store: ObjectStore, tmp_path: pathlib.Path) -> None:
    def broken() -> Iterator[bytes]:
        yield _pattern(6 * MIB)
        yield _pattern(6 * MIB)
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        store.put("partial", broken())
    assert store.head("partial") is None
    assert list(store.list("")) == []
    if isinstance(store, S3Store):
        uploads = store.client.list_multipart_uploads(Bucket=store.bucket)
        assert uploads.get("Uploads", []) == []  # aborted
    else:
        assert isinstance(store, FilesystemStore)
        assert [p.name for p in store.root.rglob("*") if p.is_file()] == []


# -- ranged reads ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end"),
    [
        (0, None),
        (0, 0),
        (0, 1),
        (3, 3),
        (0, 10),
        (2, 7),
        (5, None),
        (9, None),
        (9, 10),
        (5, 100),
        (10, None),
        (10, 10),
        (10, 20),
        (100, None),
        (100, 200),
    ],
)
def test_ranged_reads(store: ObjectStore, start: int, end: int | None) -> None:
    data = b"0123456789"
    store.put("r", data)
    assert store.get("r", start, end) == data[start:end]
    assert b"".join(store.iter_range("r", start, end, chunk_size=3)) == data[start:end]


def test_iter_range_streams_in_chunks(store: ObjectStore) -> None:
    data = _pattern(3 * MIB + 5)
    store.put("s", data)
    chunks = list(store.iter_range("s", 1, None, chunk_size=256 * 1024))
    assert len(chunks) > 10
    assert all(len(c) <= 256 * 1024 for c in chunks)
    assert b"".join(chunks) == data[1:]


def test_bad_ranges_are_caller_errors(store: ObjectStore) -> None:
    store.put("r", b"abc")
    with pytest.raises(ValueError, match="start"):
        store.get("r", -1)
    with pytest.raises(ValueError, match="before start"):
        store.get("r", 2, 1)


def test_missing_object(store: ObjectStore) -> None:
    assert store.head("nope") is None
    with pytest.raises(ObjectNotFound) as excinfo:
        store.get("nope")
    assert excinfo.value.key == "nope"
    with pytest.raises(ObjectNotFound):
        store.get("nope", 0, 0)
    with pytest.raises(ObjectNotFound):
        store.iter_range("nope", 5)  # eager: raised at call time, not on next()


# -- list / delete -----------------------------------------------------------------------------

_LIST_KEYS = ["b", "a/b", "a-c", "a/a/z", "a/c", "ab", "a.x", "a0", "a/b0/x", "c/d/e/f"]


def test_list_by_prefix_in_key_order(store: ObjectStore) -> None:
    for i, key in enumerate(_LIST_KEYS):
        store.put(key, b"x" * i)
    sizes = {key: i for i, key in enumerate(_LIST_KEYS)}

    def listed(prefix: str) -> list[str]:
        infos = list(store.list(prefix))
        assert all(info.size == sizes[info.key] for info in infos)
        return [info.key for info in infos]

    assert listed("") == sorted(_LIST_KEYS)
    assert listed("a/") == ["a/a/z", "a/b", "a/b0/x", "a/c"]
    assert listed("a/b") == ["a/b", "a/b0/x"]
    assert listed("a") == sorted(k for k in _LIST_KEYS if k.startswith("a"))
    assert listed("c/d/") == ["c/d/e/f"]
    assert listed("zz") == []
    assert listed("a/zz/") == []


def test_list_paginates(store: ObjectStore) -> None:
    if isinstance(store, S3Store):
        store.list_page_size = 7  # as if 1000: several pages, one cut inside a "directory"
    keys = sorted(
        [f"many/{i:03d}" for i in range(20)] + [f"many/{i:03d}/x" for i in range(0, 20, 3)]
    )
    keys = [k for k in keys if not any(o.startswith(k + "/") for o in keys)]  # fs: no a and a/x
    for key in keys:
        store.put(key, b"")
    assert [info.key for info in store.list("many/")] == keys


def test_delete_is_idempotent(store: ObjectStore) -> None:
    store.put("d/x", b"1")
    store.put("d/y", b"2")
    store.delete("d/x")
    store.delete("d/x")
    store.delete("never/existed")
    assert store.head("d/x") is None
    assert [i.key for i in store.list("d/")] == ["d/y"]
    store.put("d/x", b"again")  # a deleted key can be written again
    assert store.get("d/x") == b"again"


# -- conditional create ------------------------------------------------------------------------


def test_if_absent_second_writer_gets_object_exists(store: ObjectStore) -> None:
    store.put("once", b"first", if_absent=True)
    with pytest.raises(ObjectExists) as excinfo:
        store.put("once", b"second", if_absent=True)
    assert excinfo.value.key == "once"
    assert store.get("once") == b"first"
    store.put("once", b"third")  # an unconditional put still overwrites
    assert store.get("once") == b"third"


def test_if_absent_multipart(store: ObjectStore) -> None:
    data = _pattern(11 * MIB, seed=3)
    store.put("big-once", _chunks(data, MIB), if_absent=True)
    with pytest.raises(ObjectExists):
        store.put("big-once", _chunks(_pattern(11 * MIB, seed=4), MIB), if_absent=True)
    assert store.get("big-once") == data


def _race_if_absent(store: ObjectStore, key: str, writers: int) -> tuple[list[int], list[int]]:
    """``writers`` threads released together, each putting its own bytes with if_absent."""
    barrier = threading.Barrier(writers)
    won: list[int] = []
    lost: list[int] = []
    errors: list[BaseException] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            store.put(key, f"writer-{i}".encode(), if_absent=True)
            won.append(i)
        except ObjectExists:
            lost.append(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    return won, lost


def test_if_absent_concurrent_writers_exactly_one_wins(store: ObjectStore) -> None:
    for round_ in range(3):
        won, lost = _race_if_absent(store, f"race/{round_}", writers=8)
        assert len(won) == 1, (won, lost)
        assert len(lost) == 7
        assert store.get(f"race/{round_}") == f"writer-{won[0]}".encode()


# -- compare-and-swap --------------------------------------------------------------------------


def test_put_if_match_replaces_only_the_version_read(store: ObjectStore) -> None:
    store.put("cas", b"v1")
    read = store.get_versioned("cas")
    assert read.data == b"v1"
    store.put_if_match("cas", b"v2", read.version)
    assert store.get("cas") == b"v2"
    with pytest.raises(ObjectChanged) as excinfo:  # a second writer that read v1 too
        store.put_if_match("cas", b"v2-other", read.version)
    assert excinfo.value.key == "cas"
    assert store.get("cas") == b"v2"
    again = store.get_versioned("cas")
    assert again.data == b"v2"
    assert again.version != read.version
    store.put_if_match("cas", b"v3", again.version)
    assert store.get("cas") == b"v3"


def test_put_if_match_sees_an_unconditional_rewrite_with_the_same_bytes(
    store: ObjectStore,
) -> None:
    store.put("cas-same", b"same")
    read = store.get_versioned("cas-same")
    store.put("cas-same", b"same")  # rewritten in between, same content
    if isinstance(store, S3Store):  # S3's ETag is the content MD5: the same bytes, the same tag
        store.put_if_match("cas-same", b"next", read.version)
    else:
        with pytest.raises(ObjectChanged):
            store.put_if_match("cas-same", b"next", read.version)


def test_put_if_match_on_a_deleted_or_missing_key(store: ObjectStore) -> None:
    with pytest.raises(ObjectNotFound):
        store.get_versioned("cas-missing")
    store.put("cas-gone/k", b"v1")
    read = store.get_versioned("cas-gone/k")
    store.delete("cas-gone/k")
    with pytest.raises(ObjectChanged):
        store.put_if_match("cas-gone/k", b"v2", read.version)
    assert store.head("cas-gone/k") is None


def _race_if_match(store: ObjectStore, key: str, writers: int) -> tuple[list[int], list[int]]:
    """``writers`` threads that read one version, released together to replace it."""
    version = store.get_versioned(key).version
    barrier = threading.Barrier(writers)
    won: list[int] = []
    lost: list[int] = []

    def write(i: int) -> None:
        barrier.wait()
        try:
            store.put_if_match(key, f"writer-{i}".encode(), version)
            won.append(i)
        except ObjectChanged:
            lost.append(i)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_put_if_match_concurrent_writers_exactly_one_wins(store: ObjectStore) -> None:
    assert store.atomic_if_match()
    for round_ in range(3):
        key = f"cas-race/{round_}"
        store.put(key, b"start")
        won, lost = _race_if_match(store, key, writers=8)
        assert len(won) == 1, (won, lost)
        assert len(lost) == 7
        assert store.get(key) == f"writer-{won[0]}".encode()


# -- compose -----------------------------------------------------------------------------------


def test_compose_small_parts(store: ObjectStore) -> None:
    pieces = [b"line 1\n", b"line 2\n", b"", b"line 3\n"]
    for i, piece in enumerate(pieces):
        store.put(f"chunks/{i}", piece)
    info = store.compose("out", [f"chunks/{i}" for i in range(len(pieces))])
    assert info.size == sum(map(len, pieces))
    assert store.get("out") == b"".join(pieces)


def test_compose_empty_source_list(store: ObjectStore) -> None:
    info = store.compose("empty-out", [])
    assert info.size == 0
    assert store.get("empty-out") == b""


def test_compose_large_parts_use_server_side_copy(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = {"p/0": _pattern(5 * MIB, 10), "p/1": _pattern(6 * MIB, 11), "p/2": b"tail\n"}
    for key, data in sources.items():
        store.put(key, data)
    copies = (
        _count_calls(store, "upload_part_copy", monkeypatch) if isinstance(store, S3Store) else []
    )
    uploads = _count_calls(store, "upload_part", monkeypatch) if isinstance(store, S3Store) else []
    info = store.compose("joined", list(sources), sha256=True)
    expected = b"".join(sources.values())
    assert info.size == len(expected)
    assert info.sha256 == hashlib.sha256(expected).hexdigest()
    assert store.get("joined") == expected
    if isinstance(store, S3Store):
        assert [c["CopySourceRange"] for c in copies] == [
            f"bytes=0-{5 * MIB - 1}",
            f"bytes=0-{6 * MIB - 1}",
        ]
        assert len(uploads) == 1  # only the small tail passes through us
        head = store.head("joined")
        assert head is not None
        assert head.sha256 == info.sha256


def test_compose_mixed_sizes(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [1000, 6 * MIB, 0, 3 * MIB, 2 * MIB + 7, 5 * MIB + 3, 17, 12 * MIB + 1, 5]
    keys = []
    for i, size in enumerate(sizes):
        keys.append(f"m/{i}")
        store.put(keys[-1], _pattern(size, seed=i))
    copies = (
        _count_calls(store, "upload_part_copy", monkeypatch) if isinstance(store, S3Store) else []
    )
    info = store.compose("mixed", keys)
    expected = b"".join(_pattern(size, seed=i) for i, size in enumerate(sizes))
    assert info.size == len(expected)
    assert store.get("mixed") == expected
    if isinstance(store, S3Store):
        assert copies  # the large sources were copied server-side


def test_compose_missing_source_writes_nothing(store: ObjectStore) -> None:
    store.put("c/0", b"a")
    with pytest.raises(ObjectNotFound) as excinfo:
        store.compose("c/out", ["c/0", "c/missing"])
    assert excinfo.value.key == "c/missing"
    assert store.head("c/out") is None


def test_compose_checks_expected_sizes_and_checksums(store: ObjectStore) -> None:
    good, other = b"good chunk\n", b"evil chunk\n"
    info = store.put("x/0", good)
    store.put("x/1", b"second\n")
    expected = [info, ObjectInfo("x/1", 7)]
    assert store.compose("x/out", expected).size == len(good) + 7

    with pytest.raises(IntegrityError, match="expected 99 bytes"):
        store.compose("x/out2", [ObjectInfo("x/0", 99)])
    # Same size, other bytes, checksum recorded by the store: caught without reading.
    store.put("x/0", other)
    with pytest.raises(IntegrityError):
        store.compose("x/out2", [info])
    # Same size, other bytes, written behind the store's back: caught by hashing the source.
    store.put("x/0", good)
    _corrupt(store, "x/0", other)
    with pytest.raises(IntegrityError):
        store.compose("x/out2", [info])
    assert store.head("x/out2") is None


def test_compose_if_absent(store: ObjectStore) -> None:
    store.put("s/0", b"a")
    store.compose("s/out", ["s/0"], if_absent=True)
    with pytest.raises(ObjectExists):
        store.compose("s/out", ["s/0", "s/0"], if_absent=True)
    assert store.get("s/out") == b"a"


def test_compose_is_repeatable(store: ObjectStore) -> None:
    """Finalisation may run twice (operator restart): the same compose gives the same bytes."""
    store.put("f/0", _pattern(6 * MIB))
    store.put("f/1", b"end")
    first = store.compose("f/out", ["f/0", "f/1"], sha256=True)
    second = store.compose("f/out", ["f/0", "f/1"], sha256=True)
    assert first.sha256 == second.sha256
    assert first.size == second.size == 6 * MIB + 3


# -- keys --------------------------------------------------------------------------------------

_BAD_KEYS = [
    "",
    "/abs",
    "a//b",
    "a/",
    "../x",
    "a/../../x",
    "a/./b",
    ".",
    "..",
    "a\\b",
    "a\x00b",
    "x/.llmbatch-tmp-1",
    "a" * 1025,
]


@pytest.mark.parametrize("key", _BAD_KEYS)
def test_invalid_keys_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put(key, b"x")
    with pytest.raises(ValueError):  # InvalidKey is a ValueError too
        store.get(key)
    with pytest.raises(InvalidKey):
        store.head(key)
    with pytest.raises(InvalidKey):
        store.delete(key)


def test_unicode_keys(store: ObjectStore) -> None:
    store.put("tenant/ünï cödé/😀.jsonl", b"ok")
    assert store.get("tenant/ünï cödé/😀.jsonl") == b"ok"
    assert [i.key for i in store.list("tenant/")] == ["tenant/ünï cödé/😀.jsonl"]


# -- filesystem specifics ----------------------------------------------------------------------


def test_fs_symlink_cannot_escape_root(fs_store: FilesystemStore, tmp_path: pathlib.Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    os.symlink(outside, fs_store.root / "link")
    with pytest.raises(InvalidKey, match="outside"):
        fs_store.get("link/secret")
    with pytest.raises(InvalidKey):
        fs_store.put("link/new", b"x")
    assert not (outside / "new").exists()


def test_fs_symlinked_object_cannot_escape_root(
    fs_store: FilesystemStore, tmp_path: pathlib.Path
) -> None:
    """The key's own name is checked on every call, after its directory was found fine."""
    (tmp_path / "secret").write_bytes(b"secret")
    fs_store.put("dir/plain", b"x")  # "dir" is now known to resolve inside the root
    os.symlink(tmp_path / "secret", fs_store.root / "dir" / "link")
    with pytest.raises(InvalidKey, match="outside"):
        fs_store.get("dir/link")
    assert fs_store.get("dir/plain") == b"x"


def test_fs_object_and_prefix_conflict(fs_store: FilesystemStore) -> None:
    fs_store.put("a/b", b"x")
    with pytest.raises(StoreError):
        fs_store.put("a", b"y")
    with pytest.raises(StoreError):
        fs_store.put("a/b/c", b"z")
    assert fs_store.head("a") is None
    assert fs_store.get("a/b") == b"x"


def test_fs_delete_prunes_empty_directories(fs_store: FilesystemStore) -> None:
    fs_store.put("deep/er/key", b"x")
    fs_store.delete("deep/er/key")
    assert list(fs_store.root.iterdir()) == []


def test_fs_temp_files_are_invisible(fs_store: FilesystemStore) -> None:
    fs_store.put("dir/k", b"x")
    (fs_store.root / "dir" / ".llmbatch-tmp-leftover").write_bytes(b"partial")
    assert [i.key for i in fs_store.list("")] == ["dir/k"]


def test_fs_concurrent_put_and_delete_in_one_directory(fs_store: FilesystemStore) -> None:
    """A delete pruning a directory must not make a concurrent put into it fail."""
    errors: list[BaseException] = []

    def churn(i: int) -> None:
        try:
            for j in range(300):
                # two levels, so mkdir(parents=True) races a prune of the grandparent too
                fs_store.put(f"shared/dir/{i}-{j}", b"x")
                fs_store.delete(f"shared/dir/{i}-{j}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# -- S3 specifics ------------------------------------------------------------------------------


def test_s3_detects_native_conditional_writes(s3_store: S3Store) -> None:
    assert s3_store.uses_native_conditional_writes() is True
    assert list(s3_store.list("")) == []  # the probe object is gone


def test_s3_emulated_conditional_writes(s3_uri: str) -> None:
    store = open_store(s3_uri + "&conditional_writes=emulate")  # s3_uri has a query already
    assert isinstance(store, S3Store)
    assert store.uses_native_conditional_writes() is False
    store.put("e", b"1", if_absent=True)
    with pytest.raises(ObjectExists):
        store.put("e", b"2", if_absent=True)


def test_s3_detects_native_if_match(s3_store: S3Store) -> None:
    assert s3_store.atomic_if_match() is True
    assert list(s3_store.list("")) == []  # the probe object is gone


def test_s3_probe_detects_ignored_if_match_and_compares_first(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = s3_store.client.put_object

    def put_object(**kwargs: Any) -> Any:
        kwargs.pop("IfMatch", None)  # a server that silently ignores the header
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "put_object", put_object)
    assert s3_store.atomic_if_match() is False
    s3_store.put("m", b"1")
    read = s3_store.get_versioned("m")
    s3_store.put("m", b"2")
    with pytest.raises(ObjectChanged):  # the head-then-put fallback
        s3_store.put_if_match("m", b"3", read.version)
    s3_store.put_if_match("m", b"3", s3_store.get_versioned("m").version)
    assert s3_store.get("m") == b"3"


def test_s3_prefixes_isolate_stores(s3_server: S3Server, s3_bucket: str) -> None:
    one = open_store(s3_server.uri(s3_bucket, "tenant-one"))
    two = open_store(s3_server.uri(s3_bucket, "tenant-two"))
    root = open_store(s3_server.uri(s3_bucket))
    one.put("k", b"1")
    two.put("k", b"2")
    assert one.get("k") == b"1"
    assert [i.key for i in two.list("")] == ["k"]
    assert [i.key for i in root.list("")] == ["tenant-one/k", "tenant-two/k"]


def test_s3_missing_bucket_is_a_store_error(s3_server: S3Server) -> None:
    store = open_store(s3_server.uri("no-such-bucket-here"))
    with pytest.raises(StoreError, match="does not exist"):
        store.put("k", b"x")
    with pytest.raises(StoreError):
        list(store.list(""))


def test_s3_unreachable_endpoint_is_a_store_error(s3_server: S3Server) -> None:
    uri = s3_server.uri(
        "bucket", endpoint_url="http://127.0.0.1:9", max_attempts=1, connect_timeout=0.5
    )
    store = open_store(uri)
    with pytest.raises(StoreError):
        store.get("k")
    with pytest.raises(StoreError):
        store.head("k")


def test_s3_credentials_from_secret_dir_with_kubernetes_names(
    s3_server: S3Server, s3_bucket: str, tmp_path: pathlib.Path
) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "accessKeyID").write_text(s3_server.access_key_id + "\n")
    (secret / "secretAccessKey").write_text(s3_server.secret_access_key + "\n")
    store = open_store(s3_server.uri(s3_bucket, secret_dir=str(secret)))
    store.put("k", b"v")
    assert store.get("k") == b"v"


def test_s3_wrong_secret_is_a_store_error_and_writes_nothing(
    s3_server: S3Server, s3_bucket: str, tmp_path: pathlib.Path
) -> None:
    """The server checks signatures: a wrong secret is refused, not written."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text(s3_server.access_key_id + "\n")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text("not-the-secret\n")
    store = open_store(s3_server.uri(s3_bucket, secret_dir=str(secret)))
    with pytest.raises(StoreError, match="SignatureDoesNotMatch"):
        store.put("k", b"v")
    assert open_store(s3_server.uri(s3_bucket)).head("k") is None


class _FlakyBody:
    """A StreamingBody stand-in that breaks after ``fail_after`` bytes."""

    def __init__(self, body: Any, fail_after: int) -> None:
        self.body, self.fail_after = body, fail_after

    def iter_chunks(self, chunk_size: int) -> Iterator[bytes]:
        sent = 0
        for chunk in self.body.iter_chunks(min(chunk_size, 1000)):
            if sent + len(chunk) > self.fail_after:
                raise ResponseStreamingError(error="connection reset by peer")
            sent += len(chunk)
            yield chunk

    def close(self) -> None:
        self.body.close()


def test_s3_stream_resumes_after_a_dropped_connection(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _pattern(100_000)
    s3_store.put("flaky", data)
    calls: list[dict[str, Any]] = []
    original: Callable[..., Any] = s3_store.client.get_object

    def get_object(**kwargs: Any) -> Any:
        calls.append(kwargs)
        response = original(**kwargs)
        if len(calls) < 3:  # the first two connections drop
            response["Body"] = _FlakyBody(response["Body"], fail_after=30_000)
        return response

    monkeypatch.setattr(s3_store.client, "get_object", get_object)
    assert s3_store.get("flaky", 10) == data[10:]
    assert [c.get("Range") for c in calls] == [
        "bytes=10-",
        "bytes=30010-99999",
        "bytes=60010-99999",
    ]
    assert all(c.get("IfMatch") for c in calls[1:])  # resumed on the same object version


def test_s3_stream_gives_up_after_max_attempts(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(s3_server.uri(s3_bucket, max_attempts=2))
    assert isinstance(store, S3Store)
    store.put("flaky", _pattern(50_000))
    original: Callable[..., Any] = store.client.get_object

    def get_object(**kwargs: Any) -> Any:
        response = original(**kwargs)
        response["Body"] = _FlakyBody(response["Body"], fail_after=10_000)
        return response

    monkeypatch.setattr(store.client, "get_object", get_object)
    with pytest.raises(StoreError, match="stream failed"):
        store.get("flaky")


def test_s3_probe_detects_ignored_if_none_match(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = s3_store.client.put_object

    def put_object(**kwargs: Any) -> Any:
        kwargs.pop("IfNoneMatch", None)  # a server that silently ignores the header
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "put_object", put_object)
    assert s3_store.uses_native_conditional_writes() is False
    s3_store.put("k", b"1", if_absent=True)
    with pytest.raises(ObjectExists):  # the head-then-put fallback
        s3_store.put("k", b"2", if_absent=True)
    assert s3_store.get("k") == b"1"


def test_s3_probe_detects_not_implemented(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = s3_store.client.put_object

    def put_object(**kwargs: Any) -> Any:
        if "IfNoneMatch" in kwargs:
            raise ClientError({"Error": {"Code": "NotImplemented", "Message": "nope"}}, "PutObject")
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "put_object", put_object)
    assert s3_store.uses_native_conditional_writes() is False
    assert list(s3_store.list("")) == []  # probe cleaned up


def test_s3_complete_without_conditional_support_falls_back(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert s3_store.uses_native_conditional_writes()
    original = s3_store.client.complete_multipart_upload

    def complete(**kwargs: Any) -> Any:
        if "IfNoneMatch" in kwargs:
            raise ClientError({"Error": {"Code": "NotImplemented"}}, "CompleteMultipartUpload")
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "complete_multipart_upload", complete)
    data = _pattern(9 * MIB)
    s3_store.put("mp", data, if_absent=True)
    assert s3_store.get("mp") == data
    with pytest.raises(ObjectExists):
        s3_store.put("mp", data, if_absent=True)


def test_s3_source_deleted_during_compose(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put("g/0", _pattern(5 * MIB))
    s3_store.put("g/1", _pattern(5 * MIB, 1))
    original = s3_store.client.upload_part_copy

    def copy(**kwargs: Any) -> Any:
        if kwargs["PartNumber"] == 2:
            s3_store.delete("g/1")  # a chunk vanishes after planning
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "upload_part_copy", copy)
    with pytest.raises(ObjectNotFound) as excinfo:
        s3_store.compose("g/out", ["g/0", "g/1"])
    assert excinfo.value.key == "g/1"
    assert s3_store.head("g/out") is None
    assert s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads", []) == []


def test_s3_large_source_replaced_during_compose_is_refused_by_the_copy_pin(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source copied server-side (``UploadPartCopy``) is pinned to the ETag seen when the
    compose was planned: another writer's same-size rewrite in between is refused by the server
    (``x-amz-copy-source-if-match``), not copied into the result."""
    s3_store.put("r/0", _pattern(5 * MIB))
    s3_store.put("r/1", _pattern(5 * MIB, 1))
    original = s3_store.client.upload_part_copy

    def copy(**kwargs: Any) -> Any:
        if kwargs["PartNumber"] == 2:  # same size, other bytes: only the ETag tells
            s3_store.put("r/1", _pattern(5 * MIB, 2))
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "upload_part_copy", copy)
    with pytest.raises(IntegrityError, match="changed"):
        s3_store.compose("r/out", ["r/0", "r/1"])
    assert s3_store.head("r/out") is None
    assert s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket).get("Uploads", []) == []


def test_s3_source_replaced_during_compose(
    s3_store: S3Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_store.put("h/0", b"original bytes\n")
    s3_store.put("h/1", b"tail\n")
    original: Callable[..., Any] = s3_store.client.get_object

    def get_object(**kwargs: Any) -> Any:
        if kwargs["Key"].endswith("h/0"):  # another writer replaces the chunk after planning
            s3_store.client.put_object(
                Bucket=s3_store.bucket, Key=kwargs["Key"], Body=b"REPLACED bytes\n"
            )
        return original(**kwargs)

    monkeypatch.setattr(s3_store.client, "get_object", get_object)
    with pytest.raises(IntegrityError, match="replaced"):
        s3_store.compose("h/out", ["h/0", "h/1"])
    assert s3_store.head("h/out") is None


_segments = st.text(alphabet="ab-.0~é", min_size=1, max_size=3).filter(
    lambda seg: seg not in (".", "..")
)
_keys = st.lists(st.lists(_segments, min_size=1, max_size=3).map("/".join), max_size=12)


@settings(max_examples=30, deadline=None)
@given(keys=_keys, prefix=st.text(alphabet="ab-.0~é/", max_size=4))
def test_fs_list_matches_s3_key_order(keys: list[str], prefix: str) -> None:
    """The filesystem walk yields exactly the keys S3 would, in S3's (UTF-8 byte) order."""
    keys = sorted({k for k in keys if not any(o.startswith(k + "/") for o in keys)})
    with tempfile.TemporaryDirectory() as root:
        fs = FilesystemStore(root)
        for key in keys:
            fs.put(key, b"")
        expected = sorted((k for k in keys if k.startswith(prefix)), key=lambda k: k.encode())
        try:
            listed = [info.key for info in fs.list(prefix)]
        except InvalidKey:
            # the documented refusals: an absolute prefix, or one with a . or .. segment
            assert prefix.startswith("/") or any(
                seg in (".", "..") for seg in prefix.split("/")[:-1]
            )
            return
        assert listed == expected


def test_fs_put_retries_when_a_prune_races_mkdir(
    fs_store: FilesystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making a directory raises FileNotFoundError when a delete prunes the parent just made
    for it; the put makes the directories again instead of failing."""
    real_mkdir = os.mkdir
    calls: list[Any] = []

    def racing_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise FileNotFoundError(2, "No such file or directory", str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", racing_mkdir)
    fs_store.put("a/b/key", b"x")
    assert fs_store.get("a/b/key") == b"x"
    assert len(calls) >= 2


def test_an_sse_store_writes_and_reads_every_way_on_the_real_server(
    s3_server: S3Server, s3_bucket: str
) -> None:
    """SSE-S3 headers on every object-creating request are accepted by the session's S3 server
    (what it does with them is the server's: some S3-compatible servers ignore them; the headers
    themselves are checked in tests/unit/test_store_encryption.py); every write path still
    round-trips."""
    store = open_store(s3_server.uri(s3_bucket, "sse", sse="AES256"))
    data = _pattern(9 * MIB + 7, seed=3)
    store.put("a/small", b"small", if_absent=True)
    store.put_if_match("a/small", b"again", store.get_versioned("a/small").version)
    store.put("a/big", _chunks(data, 1 << 20))  # multipart
    store.compose("a/joined", ["a/big", "a/small"])  # UploadPartCopy + a buffered part
    assert store.get("a/joined") == data + b"again"
