"""Which weights a pinned model revision means on disk (seed 000: "submission pins the model
revision").

A pool model names its weights by ``source`` (a local folder) and optionally a ``revision``. The
engine loads a folder, so the revision has to be turned into one, or checked against it:

* ``source`` is a Hugging Face cache repository (``models--org--name`` with ``snapshots/`` and
  ``refs/``): the revision is a ref (``refs/<name>`` holds a commit) or a commit (a snapshot's
  name, or an unambiguous prefix of at least 7 characters); the folder loaded is that snapshot.
  Without a revision, ``refs/main``.
* ``source`` is a snapshot folder itself (its parent is ``snapshots``): its name is the commit it
  holds; a pinned revision must be that commit, a prefix of it, or a ref that points at it.
* any other folder may declare what it holds in a ``REVISION`` file (first line); a pinned
  revision must match it. A folder that declares nothing cannot be checked: the revision is then
  served as a label (``verified`` False) and the executor says so in its log.

A revision that does not match is a :class:`RevisionMismatch`: the slot does not start, rather
than serve other weights under the pinned name. Pure: reads the folder, imports nothing heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The marker a plain weights folder may carry: the revision it holds, on its first line.
MARKER = "REVISION"
#: The shortest commit prefix accepted for a pinned revision (as git's abbreviations).
MIN_PREFIX = 7


class RevisionMismatch(Exception):
    """The pinned revision is not what the weights folder holds, or not in the cache."""


@dataclass(frozen=True)
class Weights:
    """The folder the engine loads and the revision it holds."""

    folder: Path
    revision: str | None
    """The commit (or declared revision) of the folder; the pin itself when unverified."""
    verified: bool
    """True when the folder itself says it holds ``revision``."""


def resolve(source: str, revision: str | None) -> Weights:
    """The weights folder for ``source`` at ``revision`` (see the module docstring)."""
    if revision is not None and (revision.startswith("/") or ".." in revision.split("/")):
        raise RevisionMismatch(f"{revision!r} is not a revision (a ref or a commit)")
    path = Path(source).expanduser()
    if (path / "snapshots").is_dir():
        return _in_cache_repo(path, revision or "main")
    if path.parent.name == "snapshots":
        return _snapshot(path, revision)
    declared = _declared(path)
    if revision is None:
        return Weights(path, declared, declared is not None)
    if declared is None:
        return Weights(path, revision, False)
    if declared != revision:
        raise RevisionMismatch(
            f"model folder {path} holds revision {declared!r} ({MARKER}), "
            f"the pool pins {revision!r}"
        )
    return Weights(path, declared, True)


def _in_cache_repo(repo: Path, revision: str) -> Weights:
    commit = _commit_of(repo, revision)
    if commit is None:
        have = sorted(p.name for p in (repo / "snapshots").iterdir() if p.is_dir())
        refs = sorted(p.name for p in (repo / "refs").iterdir()) if (repo / "refs").is_dir() else []
        raise RevisionMismatch(
            f"revision {revision!r} is not in the model cache {repo} "
            f"(refs: {', '.join(refs) or 'none'}; snapshots: {', '.join(have) or 'none'})"
        )
    return Weights(repo / "snapshots" / commit, commit, True)


def _snapshot(folder: Path, revision: str | None) -> Weights:
    commit = folder.name
    if revision is None or _commit_of(folder.parent.parent, revision) == commit:
        return Weights(folder, commit, True)
    raise RevisionMismatch(
        f"model folder {folder} is snapshot {commit}, the pool pins {revision!r}"
    )


def _commit_of(repo: Path, revision: str) -> str | None:
    """The snapshot commit ``revision`` names in cache repository ``repo``, if any."""
    snapshots = repo / "snapshots"
    ref = repo / "refs" / revision
    if ref.is_file():
        commit = ref.read_text().strip()
        return commit if (snapshots / commit).is_dir() else None
    if (snapshots / revision).is_dir():
        return revision
    if len(revision) < MIN_PREFIX or not snapshots.is_dir():
        return None
    matches = [p.name for p in snapshots.iterdir() if p.is_dir() and p.name.startswith(revision)]
    return matches[0] if len(matches) == 1 else None


def _declared(folder: Path) -> str | None:
    marker = folder / MARKER
    if not marker.is_file():
        return None
    lines = marker.read_text(encoding="utf-8", errors="replace").splitlines()
    first = lines[0].strip() if lines else ""
    return first or None
