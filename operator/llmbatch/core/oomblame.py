"""Who a slot killed for memory is laid at: the requests with media it held, not its neighbours.

Images are what can make one request take a slot's memory (a decompression bomb that slipped
past the header check, many large images at once); text cannot. A slot names every request
with media in a heartbeat before it enters the engine (``SlotHeartbeat.shards[].media_in_flight``,
a superset of what was inside), so when its process is killed for memory (its pod's container
ended ``OOMKilled``) the operator reads the last heartbeat and decides, by the rule here:

* no request with media was named: the kill is nobody's in particular, the usual rule for a
  lost slot applies (``core.leases.settle``);
* exactly one was named: it is blamed — its next run answers it with a ``media_out_of_memory``
  error line instead of running it; its shard and every other shard on the slot go back to the
  queue with no attempt counted and the slot not held against them;
* several were named: each becomes a crash suspect (run alone next time, so a second kill names
  it alone), and again no shard is charged an attempt.

Pure: the heartbeat's reports in, the verdict out; the store writes and the lease are the
controller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llmbatch.core.leases import RunEnd

MEDIA_OUT_OF_MEMORY = "media_out_of_memory"
"""The error code of a request blamed for its slot's out-of-memory kill."""
_MESSAGES = {
    MEDIA_OUT_OF_MEMORY: (
        "This request's images or audio took more memory than its slot has: the slot was "
        "killed for memory while this was the only request with media in its engine, so it "
        "is not run again. Send fewer or smaller images (fewer pixels) per request."
    ),
}


@dataclass(frozen=True)
class MediaVerdict:
    """What one shard's requests are charged with after the kill."""

    blamed: tuple[str, ...] = ()
    """custom_ids answered with :data:`MEDIA_OUT_OF_MEMORY`, never run again."""
    suspects: tuple[str, ...] = ()
    """custom_ids run alone next time."""

    @property
    def charged(self) -> int:
        return len(self.blamed) + len(self.suspects)


def blame_out_of_memory(
    media_in_flight: Mapping[str, Sequence[str]],
) -> dict[str, MediaVerdict] | None:
    """The verdict on each shard (by assignment key) of a slot killed for memory, given the
    requests with media its last heartbeat named per shard; None when it named none (the kill
    is not laid at media). A shard the slot held without media named gets no entry: it goes
    back without blame."""
    named = {key: tuple(dict.fromkeys(ids)) for key, ids in media_in_flight.items() if ids}
    if not named:
        return None
    if sum(len(ids) for ids in named.values()) == 1:
        return {key: MediaVerdict(blamed=ids) for key, ids in named.items()}
    return {key: MediaVerdict(suspects=ids) for key, ids in named.items()}


def out_of_memory_end(end: RunEnd, verdict: MediaVerdict | None) -> RunEnd:
    """How the run ``end`` of a shard on a slot killed for memory with media inside counts: no
    attempt, and a crash of the shard only when it had a request charged."""
    charged = verdict.charged if verdict is not None else 0
    message = f"{end.message or end.state}; the slot was killed for memory with media inside"
    return RunEnd(end.state, end.slot, message, counts_attempt=False, crash_suspects=charged)


def blame_message(code: str) -> str:
    """The message of an error line for a request blamed with ``code``."""
    return _MESSAGES.get(code, f"This request was blamed for its slot's end ({code}).")
