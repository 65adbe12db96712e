"""``python -m llmbatch.devcluster supervise STATE_DIR``: the dev-cluster supervisor process."""

from __future__ import annotations

import sys
from pathlib import Path

from llmbatch.devcluster.supervisor import supervise


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "supervise":
        print("usage: python -m llmbatch.devcluster supervise STATE_DIR", file=sys.stderr)
        return 2
    return supervise(Path(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
