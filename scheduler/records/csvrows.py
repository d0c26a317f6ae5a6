"""csv: a header row, then one dict of strings per row."""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ir.errors import ValidationError, shown
from scheduler.records.base import CHUNK_BYTES, BadRecord, too_large

#: A byte of a csv line that is not UTF-8, as `errors="surrogateescape"` decodes it.
_UNDECODED = re.compile("[\udc80-\udcff]")


class _RecordTooLarge(Exception):
    """A csv record went over the cap: the line that did is read past (`size`: the record's bytes so far)."""

    def __init__(self, size: int, more: bool):
        super().__init__(size)
        self.size, self.more = size, more


class _Lines:
    """The lines of a csv file as the csv module reads them, noting the first byte that is not UTF-8, and
    each read bounded: a record over `limit` is refused. The reader sets `first` (the line where a record starts)
    and `size` (its bytes so far) to 0 before each record."""

    __slots__ = ("bad", "f", "first", "limit", "number", "pending", "size")

    def __init__(self, f: Any, limit: int):
        self.f, self.limit, self.number, self.bad, self.pending = f, limit, 0, None, ""
        self.first, self.size = 0, 0

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        line = self._read(self.limit + 2)  # `limit` characters and a \r\n at most
        if not line:
            raise StopIteration
        self.number += 1
        if self.bad is None and not line.isascii() and (byte := _UNDECODED.search(line)):
            code, column = ord(byte.group()) - 0xDC00, byte.start() + 1
            self.bad = f"line {self.number}: not UTF-8 (byte 0x{code:02x} at column {column})"
        ended = line.endswith(("\n", "\r"))
        self.size += _utf8_bytes(line.rstrip("\r\n") if ended else line)
        if self.size > self.limit:
            whole = ended or len(line) < self.limit + 2
            while not whole and (piece := self._read(CHUNK_BYTES)):  # the rest of the line, unread
                whole = piece.endswith(("\n", "\r"))
                self.size += _utf8_bytes(piece.rstrip("\r\n"))
            raise _RecordTooLarge(self.size, self.number > self.first)
        return line

    def _read(self, size: int) -> str:
        """One line of at most `size` characters; a \r\n cut in two by the limit is kept whole."""
        line, self.pending = self.pending + self.f.readline(size), ""
        if line.endswith("\r") and len(line) >= size and (after := self.f.read(1)):
            if after == "\n":
                line += after
            else:
                self.pending = after
        return line


def _utf8_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


def read(path: Path, label: str, limit: int) -> Iterator[Any]:
    # newline="": the csv module sees a quoted field's line breaks as they are (it ends records itself)
    with path.open(encoding="utf-8-sig", errors="surrogateescape", newline="") as f:
        lines = _Lines(f, limit)
        csv.field_size_limit(max(limit, csv.field_size_limit()))  # a field may be as long as a record
        rows = csv.reader(lines, strict=True)  # strict: a stray or unclosed quote is an error, not data
        header: list[str] | None = None
        while True:
            start = lines.number + 1  # the line where the next record starts
            lines.size, lines.first = 0, start
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                row, lines.bad = [], f"line {start}: not CSV ({exc})"
            except _RecordTooLarge as exc:
                row, lines.bad = [], too_large(f"line {start}", exc.size, limit, exc.more)
            problem, lines.bad = lines.bad, None
            if problem is not None:
                if header is None:
                    raise ValidationError(f"{label} {problem}")
                yield BadRecord(start, f"{label} {problem}")
            elif not row:  # a blank line
                continue
            elif header is None:
                header = _header(row, f"{label} line {start}")
            elif len(row) != len(header):
                fields = "1 field" if len(row) == 1 else f"{len(row)} fields"
                yield BadRecord(start, f"{label} line {start}: {fields}, the header has {len(header)}")
            else:
                yield dict(zip(header, row, strict=True))


def _header(row: list[str], where: str) -> list[str]:
    """The field names, each non-empty and used once; else a ValidationError naming the column."""
    seen: dict[str, int] = {}
    for column, name in enumerate(row, 1):
        if not name.strip():
            raise ValidationError(f"{where}, column {column}: empty header name")
        if name in seen:
            raise ValidationError(f"{where}, column {column}: header name {shown(name)} repeats column {seen[name]}")
        seen[name] = column
    return row
