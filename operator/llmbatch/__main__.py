"""``python -m llmbatch`` is the ``llmbatch`` command (same name in usage lines and the shell
completion variable, ``_LLMBATCH_COMPLETE``)."""

from llmbatch.cli import main

main(prog_name="llmbatch")
