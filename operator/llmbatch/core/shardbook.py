"""A batch's shards as its status keeps them, bounded whatever the plan's length.

A plan of at most :data:`LISTED_SHARDS` shards is listed whole in ``status.shards`` (the common
small batch: nothing in the store to read). A longer plan is one object in the store
(:class:`~llmbatch.api.resources.ShardPlanRef`); the status then lists only the shards with a
state worth showing (running, failed, or waiting again after a run), and folds the succeeded
ones into :class:`~llmbatch.api.resources.SucceededShards`. A shard of a stored plan that is
neither listed nor succeeded waits for its first slot. So a 50,000-request batch of 200 shards
keeps a few KB of shard status, not 50 KB (docs/architecture.md, "Lean objects").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from llmbatch.api.resources import ShardPlanRef, ShardStatus, SucceededShards
from llmbatch.core.validation.shards import ShardRange

#: The most shards a plan lists in the status; a longer plan is stored.
LISTED_SHARDS = 16

#: The phases after which a shard runs no more.
FINISHED = ("Succeeded", "Failed")


def format_indexes(indexes: Iterable[int]) -> str:
    """``0-57,60``: sorted indexes as ranges."""
    runs: list[list[int]] = []
    for index in sorted(set(indexes)):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_indexes(text: str) -> set[int]:
    """The indexes :func:`format_indexes` wrote."""
    found: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


def plan_document(shards: list[ShardRange]) -> bytes:
    """The stored form of a plan: one ``[index, start, end, first_line, lines, requests]`` row
    a shard."""
    rows = [[s.index, s.start, s.end, s.first_line, s.line_count, s.request_count] for s in shards]
    return json.dumps(rows, separators=(",", ":")).encode()


def parse_plan(data: bytes) -> list[ShardRange]:
    """The ranges :func:`plan_document` wrote."""
    return [ShardRange(*(int(v) for v in row)) for row in json.loads(data)]


def plan_ref(key: str, shards: list[ShardRange]) -> ShardPlanRef:
    """The status's reference to a plan stored at ``key``."""
    return ShardPlanRef(
        key=key,
        count=len(shards),
        shard_requests=shards[0].request_count if shards else 0,
        last_requests=shards[-1].request_count if shards else 0,
    )


def is_stored(shards: list[ShardRange]) -> bool:
    """Whether a plan is too long to list in the status."""
    return len(shards) > LISTED_SHARDS


def waiting_shard(shard: ShardRange) -> ShardStatus:
    """A shard of the plan that waits for its first slot."""
    return ShardStatus(
        index=shard.index,
        start=shard.start,
        end=shard.end,
        first_line=shard.first_line,
        line_count=shard.line_count,
        request_count=shard.request_count,
    )


def range_of(shard: ShardStatus) -> ShardRange:
    """A listed shard's range (:func:`waiting_shard` the other way)."""
    return ShardRange(
        shard.index, shard.start, shard.end, shard.first_line, shard.line_count, shard.request_count
    )


def unlisted_waiting(count: int, listed: Iterable[int], succeeded: str) -> list[int]:
    """The shards of a stored plan of ``count`` that wait for their first slot: neither
    ``listed`` nor ``succeeded``."""
    known = set(listed) | parse_indexes(succeeded)
    return [i for i in range(count) if i not in known]


def requests_of(plan: ShardPlanRef, index: int) -> int:
    """Requests of shard ``index`` of a stored plan."""
    return plan.last_requests if index == plan.count - 1 else plan.shard_requests


def worth_listing(shard: ShardStatus) -> bool:
    """Whether a shard of a stored plan is listed: it runs, failed, or waits again after a
    run (its re-runs, take-backs or slot are worth showing). Succeeded shards are folded."""
    if shard.phase == "Succeeded":
        return False
    if shard.phase != "Pending":
        return True
    return bool(shard.job or shard.reruns or shard.preemptions or shard.message)


def compact(
    shards: list[ShardStatus], succeeded: SucceededShards | None
) -> tuple[list[ShardStatus], SucceededShards]:
    """The status form of a stored plan's shards after a step: ``shards`` are the listed and
    waiting shards the step looked at, ``succeeded`` those folded before it; the newly
    succeeded fold in, the waiting ones that never ran drop out."""
    folded = succeeded or SucceededShards()
    done = parse_indexes(folded.indexes)
    newly = [s for s in shards if s.phase == "Succeeded" and s.index not in done]
    if newly:
        folded = SucceededShards(
            indexes=format_indexes(done | {s.index for s in newly}),
            count=folded.count + len(newly),
            preemptions=folded.preemptions + sum(s.preemptions for s in newly),
            reruns=folded.reruns + sum(s.reruns for s in newly),
        )
    return [s for s in shards if worth_listing(s)], folded


def shard_indexes(
    status_shards: list[ShardStatus] | None, plan: ShardPlanRef | None
) -> range | list[int]:
    """Every shard's index: the stored plan's, else the listed ones."""
    if plan is not None:
        return range(plan.count)
    return [s.index for s in status_shards or []]


def raw_waiting(status: Mapping[str, Any]) -> Iterator[tuple[int, int]]:
    """(index, requests) of the unlisted waiting shards of a Batch status as the API holds it
    (camelCase dict); none when the plan is listed whole."""
    raw = status.get("shardPlan")
    if not raw:
        return
    plan = ShardPlanRef.model_validate(raw)
    listed = (int(s["index"]) for s in status.get("shards") or [])
    succeeded = str((status.get("succeededShards") or {}).get("indexes") or "")
    for index in unlisted_waiting(plan.count, listed, succeeded):
        yield index, requests_of(plan, index)
