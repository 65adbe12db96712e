"""Loading the shard and slot specs (the models live in :mod:`llmbatch.api`)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import SlotSpec


def _read(source: str, what: str) -> str | bytes:
    """The text of a spec given as a file, inline JSON, stdin (``-``) or ``<store-uri>#<key>``."""
    if source.lstrip().startswith("{"):
        return source
    if source == "-":
        return sys.stdin.read()
    if "#" in source and "://" in source:
        from llmbatch.storage import open_store

        uri, key = source.rsplit("#", 1)
        return open_store(uri).get(key)
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"{what} not found: {source}")
    return path.read_bytes()


def load_spec(source: str) -> ShardSpec:
    """Read a shard spec from a file, inline JSON, stdin (``-``) or ``<store-uri>#<key>``.

    Raises ValueError (or pydantic's ValidationError) for a spec that cannot be used.
    """
    return ShardSpec.model_validate_json(_read(source, "shard spec"))


def load_slot_spec(source: str) -> SlotSpec:
    """Read a slot spec from the same kinds of source as :func:`load_spec`."""
    return SlotSpec.model_validate_json(_read(source, "slot spec"))
