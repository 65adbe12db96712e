"""Lines of a batch input file: the UTF-8 BOM, CRLF endings and blank lines."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

UTF8_BOM = b"\xef\xbb\xbf"
WHITESPACE = frozenset(b" \t\r\n\x0b\x0c")
"""The bytes ``bytes.strip()`` removes: a line starting with none of them is not blank."""


def iter_lines(chunks: Iterable[bytes], first_line: int = 1) -> Iterator[tuple[int, bytes]]:
    """Split a byte stream into ``(line_number, line)`` pairs without newline, CR or BOM.

    Blank lines are skipped (their numbers still count). Used by the executor on a shard range.
    """
    number = first_line - 1
    pending = b""
    for chunk in chunks:
        buffer = pending + chunk if pending else chunk
        parts = buffer.split(b"\n")
        pending = parts.pop()
        for raw in parts:
            number += 1
            text = _clean(raw, number)
            if text:
                yield number, text
    if pending:
        number += 1
        text = _clean(pending, number)
        if text:
            yield number, text


def _clean(raw: bytes, number: int) -> bytes:
    text = raw[len(UTF8_BOM) :] if number == 1 and raw.startswith(UTF8_BOM) else raw
    if text.endswith(b"\r"):
        text = text[:-1]
    return text if text.strip() else b""
