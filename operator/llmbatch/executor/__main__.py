"""``python -m llmbatch.executor``."""

from __future__ import annotations

import sys

from llmbatch.executor.main import main

if __name__ == "__main__":
    sys.exit(main())
