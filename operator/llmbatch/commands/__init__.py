"""CLI subcommands (top layer: may use every other package)."""
