"""``python -m llmbatch`` is the ``llmbatch`` command."""

from llmbatch.cli import main

main()
