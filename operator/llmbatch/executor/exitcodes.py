"""Exit codes of ``python -m llmbatch.executor`` and the termination message.

The codes follow BSD ``sysexits.h`` so they never collide with a signal death (128 + N) and a
Job's ``podFailurePolicy`` can tell them apart:

====  ==============  =============================================================  ==========
code  name            meaning                                                        retry?
====  ==============  =============================================================  ==========
0     DONE            every request of the range has a committed result line         no
1     UNEXPECTED      a bug (traceback in the log)                                   yes
70    ENGINE_FAILED   the engine died or hung (watchdog); finished results committed yes
74    STORE_FAILED    the object store failed (read input / write results)           yes
75    PREEMPTED       SIGTERM/SIGINT: stopped taking work, committed what finished   yes, free
78    BAD_CONFIG      unusable spec, missing model, engine rejected its arguments    no
====  ==============  =============================================================  ==========

``PREEMPTED`` is meant for ``podFailurePolicy: {action: Ignore, onExitCodes: [75]}`` so that
preemption never consumes the Job's retry budget; ``BAD_CONFIG`` for ``action: FailJob``.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path

TERMINATION_LOG_DEFAULT = "/dev/termination-log"
TERMINATION_LOG_ENV = "LLMBATCH_TERMINATION_LOG"
_MAX_MESSAGE = 4096  # Kubernetes keeps at most 4096 bytes of a termination message


class ExitCode(enum.IntEnum):
    DONE = 0
    UNEXPECTED = 1
    ENGINE_FAILED = 70
    STORE_FAILED = 74
    PREEMPTED = 75
    BAD_CONFIG = 78


def termination_log_path(cli_value: str | None) -> str:
    """The path from ``--termination-log``, else ``$LLMBATCH_TERMINATION_LOG``, else the default."""
    return cli_value or os.environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG_DEFAULT


def write_termination_message(path: str, message: str) -> bool:
    """Write ``message`` (truncated to 4 KiB) where Kubernetes reads it; False when impossible."""
    data = message.encode("utf-8")[:_MAX_MESSAGE]
    try:
        target = Path(path)
        if not target.parent.is_dir():
            return False
        target.write_bytes(data)
    except OSError:
        return False
    return True
