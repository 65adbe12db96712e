"""``python -m llmbatch.devcluster supervise STATE_DIR``: the dev-cluster supervisor process;
``… agent STATE_DIR``: its node agent (a supervised process);
``… watchdog PID MARKER [RUN]``: kills the run's processes once the supervisor is gone."""

from __future__ import annotations

import sys
from pathlib import Path

USAGE = """usage: python -m llmbatch.devcluster supervise STATE_DIR
       python -m llmbatch.devcluster agent STATE_DIR
       python -m llmbatch.devcluster watchdog PID MARKER [RUN]"""


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "supervise":
        from llmbatch.devcluster.supervisor import supervise

        return supervise(Path(argv[1]))
    if len(argv) == 2 and argv[0] == "agent":
        from llmbatch.devcluster.agentprocess import main as agent

        return agent(Path(argv[1]))
    if len(argv) in (3, 4) and argv[0] == "watchdog":
        from llmbatch.devcluster.procs import watchdog

        watchdog(int(argv[1]), argv[2], argv[3] if len(argv) == 4 else None)
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
