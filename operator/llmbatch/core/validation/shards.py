"""The shard plan that falls out of validation: contiguous byte ranges on line boundaries."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ShardRange:
    """A contiguous byte range ``[start, end)`` of the input holding whole lines."""

    index: int
    start: int
    end: int
    first_line: int
    line_count: int
    request_count: int


#: The most shards a plan has, whatever the pool's ``shardRequests``: each costs store objects
#: (spec, lease, chunks, progress) and a read per progress fold of its batch. A long plan is
#: stored, not listed in the status (:mod:`llmbatch.core.shardbook`); 200 are still far more
#: shards than a pool has slots to run them on at once.
MAX_SHARDS = 200


@dataclass
class ShardCutter:
    """Cuts line boundaries into shards of at most ``size`` requests, and at most ``limit``
    shards: when the plan reaches the limit, neighbouring shards are joined in pairs and the
    size doubles, so a big input on a pool of small shards gets fewer, bigger ones."""

    size: int
    limit: int = MAX_SHARDS
    shards: list[ShardRange] = field(default_factory=list)
    start: int = 0
    first_line: int = 1
    lines: int = 0
    requests: int = 0

    def add_line(self, is_request: bool, end: int) -> None:
        self.lines += 1
        self.requests += int(is_request)
        if self.requests >= self.size:
            self.close(end)

    def add_blank_lines(self, count: int) -> None:
        """``count`` lines that hold no request (they never close a shard)."""
        self.lines += count

    def close(self, end: int) -> None:
        if self.lines == 0:
            return
        if self.requests == 0 and self.shards:
            # Trailing blank lines join the last shard instead of making an empty one.
            last = self.shards[-1]
            self.shards[-1] = ShardRange(
                last.index,
                last.start,
                end,
                last.first_line,
                last.line_count + self.lines,
                last.request_count,
            )
            self.start, self.first_line = end, self.first_line + self.lines
            self.lines = 0
            return
        self.shards.append(
            ShardRange(
                len(self.shards), self.start, end, self.first_line, self.lines, self.requests
            )
        )
        self.start, self.first_line = end, self.first_line + self.lines
        self.lines = self.requests = 0
        if len(self.shards) >= self.limit:
            self._coarsen()

    def _coarsen(self) -> None:
        """Join neighbouring shards in pairs and double the size of the shards still to cut."""
        pairs = [self.shards[i : i + 2] for i in range(0, len(self.shards), 2)]
        self.shards = [
            ShardRange(
                index,
                pair[0].start,
                pair[-1].end,
                pair[0].first_line,
                sum(r.line_count for r in pair),
                sum(r.request_count for r in pair),
            )
            for index, pair in enumerate(pairs)
        ]
        self.size *= 2
