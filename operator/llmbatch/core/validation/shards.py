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


@dataclass
class ShardCutter:
    """Cuts line boundaries into shards of at most ``size`` requests."""

    size: int
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
