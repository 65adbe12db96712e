"""Which build is running: the package version and the source revision it was built from.

The revision is ``$LLMBATCH_REVISION`` where the images bake it in at build time (their
``LLMBATCH_REVISION`` build arg, ``git rev-parse HEAD`` of the tree they were built from), else
the commit of the git checkout the package runs from (a development install), else ``unknown``.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from llmbatch import __version__

REVISION_ENV = "LLMBATCH_REVISION"
UNKNOWN = "unknown"
#: The repository root of a source checkout (``operator/llmbatch/`` is two levels below it).
SOURCE_ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def revision() -> str:
    """The source revision of this build (cached: read once per process)."""
    baked = os.environ.get(REVISION_ENV, "").strip()
    if baked:
        return baked
    if not (SOURCE_ROOT / ".git").exists():
        return UNKNOWN
    try:
        found = subprocess.run(
            ["git", "-C", str(SOURCE_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN
    commit = found.stdout.strip()
    return commit if found.returncode == 0 and commit else UNKNOWN


def build_labels() -> dict[str, str]:
    """The labels of the ``*_build_info`` metrics: ``version`` and ``revision``."""
    return {"version": __version__, "revision": revision()}
