"""Loading the shard spec (the models live in :mod:`llmbatch.api.shard`)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmbatch.api.shard import ShardSpec


def load_spec(source: str) -> ShardSpec:
    """Read a spec from a file, inline JSON, stdin (``-``) or ``<store-uri>#<key>``.

    Raises ValueError (or pydantic's ValidationError) for a spec that cannot be used.
    """
    text: str | bytes
    if source.lstrip().startswith("{"):
        text = source
    elif source == "-":
        text = sys.stdin.read()
    elif "#" in source and "://" in source:
        from llmbatch.storage import open_store

        uri, key = source.rsplit("#", 1)
        text = open_store(uri).get(key)
    else:
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"shard spec not found: {source}")
        text = path.read_bytes()
    return ShardSpec.model_validate_json(text)
