"""Operator and executor one version apart (#31): every message between them is read by a peer
one version ahead (fields it has never heard of) and one behind (the fields added since left
out), by the rule of ``api.shard.CHANNEL_MODEL_CONFIG`` (docs/upgrading.md)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from llmbatch.api.shard import ShardSpec
from llmbatch.api.slot import Assignment, ShardLease, ShardReport, SlotHeartbeat, SlotSpec
from llmbatch.storage.slotchannel import parse_heartbeat

SPEC: dict[str, Any] = {
    "batch_id": "batch_1",
    "batch_uid": "u1",
    "endpoint": "/v1/chat/completions",
    "store": "file:///s",
    "input_key": "in.jsonl",
    "output_prefix": "work/t/u1/shards/00000",
    "model": {"name": "m", "path": "/m"},
    "engine": {"name": "simulated", "args": {}},
}
MESSAGES: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (ShardSpec, SPEC),
    (Assignment, {"shard": SPEC, "lease_key": "k", "generation": 2}),
    (ShardLease, {"generation": 3, "slot": "s"}),
    (ShardReport, {"key": "u1-00000", "generation": 1, "state": "running"}),
    (SlotHeartbeat, {"slot": "s", "seq": 1, "state": "ready", "started_at": 1.0}),
    (
        SlotSpec,
        {
            "pool": "p",
            "slot": "s",
            "store": "file:///s",
            "channel_prefix": "slots/p/s",
            "model": {"name": "m", "path": "/m"},
            "engine": {"name": "simulated"},
        },
    ),
]


def _ahead(value: Any) -> Any:
    """What a peer one version ahead writes: a field nobody here knows, in every object (the
    engine's free ``args`` map aside: its keys are the engine's)."""
    if isinstance(value, dict):
        known = {k: v if k == "args" else _ahead(v) for k, v in value.items()}
        return {**known, "added_in_a_later_version": [1, {}]}
    if isinstance(value, list):
        return [_ahead(v) for v in value]
    return value


@pytest.mark.parametrize(("model", "minimal"), MESSAGES, ids=lambda m: getattr(m, "__name__", ""))
def test_a_peer_one_version_ahead_is_understood(
    model: type[BaseModel], minimal: dict[str, Any]
) -> None:
    full = model.model_validate(minimal).model_dump(mode="json")
    assert model.model_validate(_ahead(full)) == model.model_validate(full)


@pytest.mark.parametrize(("model", "minimal"), MESSAGES, ids=lambda m: getattr(m, "__name__", ""))
def test_a_peer_one_version_behind_is_understood(
    model: type[BaseModel], minimal: dict[str, Any]
) -> None:
    """Every field but the required ones has a default that means what an older peer does
    without it: a message with only its required fields is read."""
    message = model.model_validate(minimal)
    assert message.model_dump(exclude_defaults=True).keys() <= minimal.keys() | {"shard"}


def test_a_heartbeat_with_a_report_this_side_cannot_read_keeps_the_rest() -> None:
    beat = SlotHeartbeat(slot="s", seq=4, state="ready", started_at=1.0).model_dump(mode="json")
    beat["shards"] = [
        {"key": "a-00000", "generation": 1, "state": "done"},
        {"key": "b-00000", "generation": 1, "state": "a_state_from_the_future"},
    ]
    reading = parse_heartbeat(orjson.dumps(beat))
    assert reading.heartbeat is not None
    assert [r.key for r in reading.heartbeat.shards] == ["a-00000"]
    assert reading.problem is not None
    assert reading.stamp
    broken = parse_heartbeat(b"{not json")
    assert broken.heartbeat is None
    assert broken.stamp
    assert broken.problem
