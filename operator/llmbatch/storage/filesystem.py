"""The object store on a local (or shared POSIX) filesystem: one file per key under a root.

Writes go to a temporary file in the key's directory, are fsynced, then published with
``os.replace`` (or ``os.link`` for ``if_absent``: the link fails when the name exists, so of two
concurrent conditional writers exactly one wins). Readers therefore see whole objects only.
``put_if_match`` compares the current version and replaces under an exclusive ``flock`` on the
key's directory, so of two writers that read one version exactly one wins (on one host, or on a
shared filesystem whose ``flock`` is cluster-wide, as NFSv4's is). The
sha256 of every write is kept in the ``user.llmbatch.sha256`` extended attribute where the
filesystem supports xattrs (``head`` reports ``sha256=None`` elsewhere).

Private: every file the store writes is 0600 and every directory it makes 0700, whatever the
process umask (modes are set explicitly, and the temporary file is made 0600 before a byte is
written, so no moment exists when another user could open it). An existing root keeps its mode.

Keys map to paths (``a/b/c`` → ``<root>/a/b/c``), so unlike S3 a key cannot be both an object and
a "directory" of other keys: writing ``a`` when ``a/b`` exists fails with :class:`StoreError`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import pathlib
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import BinaryIO

from llmbatch.storage.base import (
    RESERVED_SEGMENT_PREFIX,
    IntegrityError,
    InvalidKey,
    ObjectChanged,
    ObjectExists,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    StoreError,
    Versioned,
    check_expected,
    check_range,
    source_key,
    validate_key,
)
from llmbatch.storage.streams import iter_chunks, verified_source_stream

_XATTR_SHA256 = "user.llmbatch.sha256"
FILE_MODE = 0o600
"""Mode of every object file (and its temporary file): the store's user only."""
DIR_MODE = 0o700
"""Mode of every directory the store makes."""
_TMP_PREFIX = f"{RESERVED_SEGMENT_PREFIX}tmp-"
#: Directories remembered as resolving inside the root (then the memory starts again).
_CHECKED_DIRS = 4096


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_sha256(path: pathlib.Path) -> str | None:
    if not hasattr(os, "getxattr"):
        return None
    try:
        return os.getxattr(path, _XATTR_SHA256).decode("ascii")
    except OSError:
        return None


def _etag(st: os.stat_result) -> str:
    """Changes whenever the key is rewritten (new inode) — like an S3 ETag, not a content hash."""
    return f'"{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"'


def _version(file: BinaryIO) -> Versioned:
    """The whole of an open object and its version tag: its ETag (the inode, which every write
    replaces) and its content hash, so a reused inode with the same timestamp still differs."""
    st = os.fstat(file.fileno())
    data = file.read()
    return Versioned(data, f"{_etag(st)[1:-1]}-{hashlib.sha256(data).hexdigest()[:16]}")


@contextlib.contextmanager
def _locked(directory: pathlib.Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` (released when its descriptor closes)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_sha256(fd: int, digest: str) -> None:
    if hasattr(os, "setxattr"):
        # Best effort: tmpfs before Linux 6.6, some network filesystems have no user xattrs.
        with contextlib.suppress(OSError):
            os.setxattr(fd, _XATTR_SHA256, digest.encode("ascii"))


def _make_dirs(path: pathlib.Path) -> None:
    """``mkdir -p`` with every directory made 0700 (set explicitly: the umask only narrows).

    Raises like ``Path.mkdir``: FileNotFoundError when a parent made here was removed before
    its child could be made, FileExistsError / NotADirectoryError when a parent is a file.
    """
    if path.is_dir():
        return
    missing: list[pathlib.Path] = []
    for parent in (path, *path.parents):
        if parent.is_dir():
            break
        missing.append(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # a concurrent writer made it (with the same mode)
        os.chmod(directory, DIR_MODE)


class FilesystemStore(ObjectStore):
    """An :class:`ObjectStore` whose objects are files under ``root`` (created when missing)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root_path = pathlib.Path(root)
        if not root_path.is_absolute():
            raise ValueError(f"filesystem store root must be absolute: {root}")
        _make_dirs(root_path)
        self.root = root_path.resolve()
        self._inside: set[pathlib.Path] = set()  # directories found to resolve inside the root

    def __repr__(self) -> str:
        return f"FilesystemStore({str(self.root)!r})"

    # -- keys and paths ---------------------------------------------------------------------------

    def _path(self, key: str) -> pathlib.Path:
        """The key's file. A symlink inside the root must not lead a key outside it: the key's
        directory is resolved the first time it is used (the keys of a batch or a slot share a
        few, and resolving one costs a syscall per path component), its own name on every call
        when it is a symlink. A directory swapped for a symlink after its first use is not seen;
        doing that takes write access to the root, which can read every object anyway."""
        validate_key(key)
        path = self.root / key
        parent = path.parent
        if parent not in self._inside:
            self._check_inside(key, parent)
            if len(self._inside) >= _CHECKED_DIRS:
                self._inside.clear()
            self._inside.add(parent)
        if os.path.islink(path):
            self._check_inside(key, path)
        return path

    def _check_inside(self, key: str, path: pathlib.Path) -> None:
        real = pathlib.Path(os.path.realpath(path))
        if real != self.root and self.root not in real.parents:
            raise InvalidKey(key, "resolves outside the store root")

    def _key(self, path: pathlib.Path) -> str:
        return path.relative_to(self.root).as_posix()

    # -- writes -----------------------------------------------------------------------------------

    def put(
        self,
        key: str,
        data: bytes | Iterable[bytes],
        *,
        if_absent: bool = False,
        sha256: str | None = None,
    ) -> ObjectInfo:
        return self._put(key, data, if_absent=if_absent, sha256=sha256, if_match=None)

    def put_if_match(self, key: str, data: bytes, version: str) -> ObjectInfo:
        return self._put(key, data, if_absent=False, sha256=None, if_match=version)

    def _put(
        self,
        key: str,
        data: bytes | Iterable[bytes],
        *,
        if_absent: bool,
        sha256: str | None,
        if_match: str | None,
    ) -> ObjectInfo:
        path = self._path(key)
        if if_match is not None and not os.path.lexists(path):
            raise ObjectChanged(key)
        if if_absent and os.path.lexists(path):
            raise ObjectExists(key)
        tmp = self._create_temp(key, path)
        try:
            hasher = hashlib.sha256()
            size = 0
            with open(tmp, "wb") as out:
                for chunk in iter_chunks(data):
                    out.write(chunk)
                    hasher.update(chunk)
                    size += len(chunk)
                out.flush()
                digest = hasher.hexdigest()
                if sha256 is not None and digest != sha256.lower():
                    raise IntegrityError(f"put {key}: data sha256 {digest} != expected {sha256}")
                _write_sha256(out.fileno(), digest)
                os.fsync(out.fileno())
                etag = _etag(os.fstat(out.fileno()))  # rename and link keep the inode
            if if_match is None:
                self._publish(key, tmp, path, if_absent=if_absent)
            else:
                self._swap(key, tmp, path, if_match)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        _fsync_dir(path.parent)
        return ObjectInfo(key=key, size=size, sha256=digest, etag=etag)

    def _create_temp(self, key: str, path: pathlib.Path) -> pathlib.Path:
        # A concurrent delete may remove the (empty) parent between mkdir and open: retry.
        for _ in range(10):
            try:
                _make_dirs(path.parent)
            except FileNotFoundError:
                # mkdir(parents=True) made a grandparent that a delete pruned before the
                # parent could be made in it
                continue
            except (FileExistsError, NotADirectoryError) as exc:
                if self._object_above(path):
                    raise StoreError(f"put {key}: a parent of the key is an object") from exc
                continue  # lost a race with a delete pruning the directory
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
            except FileNotFoundError:
                continue
            try:
                os.fchmod(fd, FILE_MODE)  # exactly 0600, whatever the umask took away
            finally:
                os.close(fd)
            return tmp
        raise StoreError(f"put {key}: parent directory keeps disappearing")

    def _object_above(self, path: pathlib.Path) -> bool:
        """Whether some parent directory of ``path`` (inside the root) is a file."""
        return any(
            parent.is_file()
            for parent in path.parents
            if parent != self.root and self.root in parent.parents
        )

    def _publish(self, key: str, tmp: pathlib.Path, path: pathlib.Path, *, if_absent: bool) -> None:
        try:
            if if_absent:
                os.link(tmp, path)
            else:
                os.replace(tmp, path)
        except FileExistsError as exc:
            raise ObjectExists(key) from exc
        except IsADirectoryError as exc:
            raise StoreError(f"put {key}: other keys live under {key}/") from exc
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                raise StoreError(f"put {key}: other keys live under {key}/") from exc
            raise StoreError(f"put {key}: {exc}") from exc

    def _swap(self, key: str, tmp: pathlib.Path, path: pathlib.Path, version: str) -> None:
        """Replace ``path`` with ``tmp`` if it is still at ``version`` (both under one lock)."""
        try:
            with _locked(path.parent):
                try:
                    with open(path, "rb") as current:
                        unchanged = _version(current).version == version
                except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                    unchanged = False
                if not unchanged:
                    raise ObjectChanged(key)
                os.replace(tmp, path)
        except FileNotFoundError as exc:  # the directory went with a delete: the object too
            raise ObjectChanged(key) from exc

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return
        except PermissionError as exc:
            if path.is_dir():  # macOS reports unlink(dir) as EPERM
                return
            raise StoreError(f"delete {key}: {exc}") from exc
        # Drop directories the delete left empty so the tree does not grow forever.
        parent = path.parent
        while parent != self.root:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def compose(
        self,
        key: str,
        sources: Sequence[str | ObjectInfo],
        *,
        if_absent: bool = False,
        sha256: bool = False,
    ) -> ObjectInfo:
        validate_key(key)
        actual: list[ObjectInfo] = []
        for source in sources:
            info = self.head(source_key(source))
            if info is None:
                raise ObjectNotFound(source_key(source))
            check_expected(source, info)
            actual.append(info)
        # The result's sha256 is always computed here: the bytes pass through us anyway.
        result = self.put(key, verified_source_stream(self, sources, actual), if_absent=if_absent)
        total = sum(info.size for info in actual)
        if result.size != total:
            raise IntegrityError(f"compose {key}: wrote {result.size} bytes, sources sum {total}")
        return result

    # -- reads ------------------------------------------------------------------------------------

    def _open(self, key: str) -> tuple[BinaryIO, int]:
        path = self._path(key)
        try:
            # A file object (not a bare fd) so a stream that is never iterated still gets closed.
            file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by _read_file
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None
        st = os.fstat(file.fileno())
        if not stat.S_ISREG(st.st_mode):
            file.close()
            raise ObjectNotFound(key)
        return file, st.st_size

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return b"".join(self.iter_range(key, start, end))

    def get_versioned(self, key: str) -> Versioned:
        file, _ = self._open(key)
        with file:
            return _version(file)

    def iter_range(
        self, key: str, start: int = 0, end: int | None = None, chunk_size: int = 1 << 20
    ) -> Iterator[bytes]:
        check_range(start, end)
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        file, size = self._open(key)  # eager: a missing key raises here, not on next()
        stop = size if end is None else min(end, size)
        return self._read_file(file, min(start, stop), stop, chunk_size)

    @staticmethod
    def _read_file(file: BinaryIO, start: int, stop: int, chunk_size: int) -> Iterator[bytes]:
        # The open file keeps reading the same inode even if the key is replaced meanwhile.
        with file:
            pos = start
            while pos < stop:
                chunk = os.pread(file.fileno(), min(chunk_size, stop - pos), pos)
                if not chunk:
                    raise IntegrityError(f"object truncated while reading at byte {pos}")
                pos += len(chunk)
                yield chunk

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        return ObjectInfo(key=key, size=st.st_size, sha256=_read_sha256(path), etag=_etag(st))

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        if prefix.startswith("/") or "\\" in prefix or "\x00" in prefix:
            raise InvalidKey(prefix, "invalid list prefix")
        if any(seg in (".", "..") for seg in prefix.split("/")[:-1]):
            raise InvalidKey(prefix, "invalid list prefix")
        directory = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        return self._walk(directory, prefix)

    def _walk(self, directory: pathlib.Path, prefix: str) -> Iterator[ObjectInfo]:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        # Sorting a directory's names with '/' appended to subdirectories yields keys in exactly
        # the order S3 lists them: all keys under "d/" sort together, right where "d/" sorts.
        keyed: list[tuple[str, os.DirEntry[str]]] = []
        for entry in entries:
            if entry.name.startswith(RESERVED_SEGMENT_PREFIX):
                continue
            if entry.is_dir(follow_symlinks=False):
                keyed.append((entry.name + "/", entry))
            elif entry.is_file(follow_symlinks=False):
                keyed.append((entry.name, entry))
        keyed.sort(key=lambda item: item[0])
        for _, entry in keyed:
            key = self._key(pathlib.Path(entry.path))
            if entry.is_dir(follow_symlinks=False):
                sub = key + "/"
                if sub.startswith(prefix) or prefix.startswith(sub):
                    yield from self._walk(pathlib.Path(entry.path), prefix)
            elif key.startswith(prefix):
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while listing
                yield ObjectInfo(key=key, size=st.st_size, etag=_etag(st))
