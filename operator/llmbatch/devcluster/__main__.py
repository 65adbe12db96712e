"""``python -m llmbatch.devcluster supervise STATE_DIR``: the dev-cluster supervisor process;
``… watchdog PID MARKER``: kills the cluster's processes once the supervisor is gone."""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m llmbatch.devcluster supervise STATE_DIR
       python -m llmbatch.devcluster watchdog PID MARKER"""


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "supervise":
        from llmbatch.devcluster.supervisor import supervise

        return supervise(Path(argv[1]))
    if len(argv) == 3 and argv[0] == "watchdog":
        from llmbatch.devcluster.procs import watchdog

        watchdog(int(argv[1]), argv[2])
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
