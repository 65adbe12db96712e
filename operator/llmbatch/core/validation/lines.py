"""Lines of a batch input file: the UTF-8 BOM, CRLF endings and blank lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

UTF8_BOM = b"\xef\xbb\xbf"
WHITESPACE = frozenset(b" \t\r\n\x0b\x0c")
"""The bytes ``bytes.strip()`` removes: a line starting with none of them is not blank."""


class LineSplitter:
    """One line in, one line out: a byte stream cut into ``(line_number, line)`` pairs.

    Newline-terminated lines (the last one may lack its newline), without the newline, a
    trailing CR or the BOM of line 1; blank lines are skipped, their numbers still count.
    ``consumed`` is the bytes of the complete lines seen so far, so a reader that loses its
    stream can open it again right after the last complete line (and a new splitter starting
    at line ``number + 1``).
    """

    def __init__(self, first_line: int = 1) -> None:
        self.number = first_line - 1
        """The number of the last complete line."""
        self.consumed = 0
        self._pending = b""

    def feed(self, chunk: bytes) -> list[tuple[int, bytes]]:
        """The non-blank lines completed by ``chunk``."""
        buffer = self._pending + chunk if self._pending else chunk
        parts = buffer.split(b"\n")
        self._pending = parts.pop()
        found = []
        for raw in parts:
            self.number += 1
            self.consumed += len(raw) + 1
            text = clean_line(raw, self.number)
            if text:
                found.append((self.number, text))
        return found

    def finish(self) -> list[tuple[int, bytes]]:
        """The last line when the stream does not end with a newline."""
        if not self._pending:
            return []
        raw, self._pending = self._pending, b""
        self.number += 1
        self.consumed += len(raw)
        text = clean_line(raw, self.number)
        return [(self.number, text)] if text else []


def iter_lines(chunks: Iterable[bytes], first_line: int = 1) -> Iterator[tuple[int, bytes]]:
    """The ``(line_number, line)`` pairs of a byte stream (:class:`LineSplitter`): the
    executor's shard range, the operator's merge and re-validation of an input."""
    splitter = LineSplitter(first_line)
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.finish()


def clean_line(raw: bytes, number: int) -> bytes:
    """Line ``number``'s text without its newline: without the BOM of line 1 and a trailing CR;
    empty when the line is blank (the one rule of what a line is, for every reader)."""
    text = raw[len(UTF8_BOM) :] if number == 1 and raw.startswith(UTF8_BOM) else raw
    if text.endswith(b"\r"):
        text = text[:-1]
    # Only a line starting with whitespace can be blank: no strip() copy of every other line.
    return b"" if not text or (text[0] in WHITESPACE and not text.strip()) else text
