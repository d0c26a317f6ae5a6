"""jsonl: one JSON value per line, each record's index its line less one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ir.limits import MAX_DEPTH, json_too_deep_at
from scheduler.records.base import BOM, CHUNK_BYTES, BadRecord, too_large


def read(path: Path, label: str, limit: int) -> Iterator[Any]:
    """A record per line, so that a record's index is always its line less one: a blank line before the last
    record is a bad record (refused, or a failed record with skip_bad); blank lines after it end the file.

    The file is read CHUNK_BYTES at a time and split into lines at once; a line is parsed by json's own scanner
    (what json.loads ends in), and only a line it does not take whole, or one with many brackets, goes the long
    way (`_json_line`), which says why it is bad. That halves the CPU of reading a file of short records."""
    blank: list[int] = []  # blank lines not yet followed by a record
    number = 0
    with path.open("rb") as f:  # bytes: only b"\n" ends a line (a str would also break on \u2028)
        for lines in _lines(f, limit):
            for raw in lines:
                number += 1
                if type(raw) is int:
                    record: Any = BadRecord(number, too_large(f"{label} line {number}", raw, limit))
                elif not raw or raw.isspace():
                    blank.append(number)
                    continue
                else:
                    record = _parsed(raw)
                    if record is _LONG_WAY:
                        if number == 1 and raw.startswith(BOM):
                            raw = raw[len(BOM) :]
                            if not raw or raw.isspace():
                                blank.append(number)
                                continue
                        record = _json_line(raw, number, label)
                if blank:
                    for empty in blank:
                        yield BadRecord(empty, f"{label} line {empty}: a blank line, expected one JSON value per line")
                    blank.clear()
                yield record


#: `_parsed`'s answer for a line json's scanner does not take whole (bad, or anything unusual): `_json_line` reads it.
_LONG_WAY = object()
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # json.loads's own scanner (C), without its wrappers
_LINE_SPACE = " \t\r"


def _parsed(raw: bytes) -> Any:
    """The JSON value `raw` holds whole, as json.loads would give it; else _LONG_WAY. A line with more brackets
    than MAX_DEPTH goes the long way unparsed (it may nest too deep; counting is cheap)."""
    if len(raw) > MAX_DEPTH and raw.count(b"[") + raw.count(b"{") > MAX_DEPTH:
        return _LONG_WAY
    try:
        text = raw.decode("utf-8")
        if text[0] in _LINE_SPACE:
            return _LONG_WAY
        value, end = _SCAN(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        return _LONG_WAY
    if end != len(text) and text[end:].strip(_LINE_SPACE):
        return _LONG_WAY
    return value


def _lines(f: Any, limit: int) -> Iterator[list[bytes | int]]:
    """The lines of `f` (without their line break) a block at a time; a line longer than `limit` bytes is its length
    instead (an int), and no more than CHUNK_BYTES and the cap of it was ever held."""
    while block := f.read(CHUNK_BYTES):
        lines: list[Any] = block.split(b"\n")
        cut = lines.pop()  # after the block's last line break: the start of a line the block cut (or b"")
        if cut:
            rest = _line(f, max(limit - len(cut), 0) if len(cut) <= limit else 0)
            if type(rest) is int:
                lines.append(len(cut) + rest)
            else:
                whole = cut + rest
                lines.append(whole[:-1] if whole.endswith(b"\n") else whole)
        if len(block) > limit:  # a line of the block itself may be over the cap
            lines = [len(line) if type(line) is bytes and len(line) > limit else line for line in lines]
        yield lines


def _line(f: Any, limit: int) -> bytes | int:
    """The next line of `f` (b"" at its end), read CHUNK_BYTES at a time; when it is longer than `limit` bytes (its
    line break aside), its length instead: the rest of it is read past, and no more than the cap was ever held."""
    piece = f.readline(CHUNK_BYTES)
    if piece.endswith(b"\n") and len(piece) <= limit + 1:  # most lines: whole in one read, under the cap
        return piece
    pieces: list[bytes] | None = [piece]
    size = len(piece)
    while piece and not piece.endswith(b"\n"):
        piece = f.readline(CHUNK_BYTES)
        size += len(piece)
        if pieces is not None:
            pieces.append(piece)
            if size > limit + 1:  # over the cap however the line ends: let go of it
                pieces = None
    if pieces is None or size - piece.endswith(b"\n") > limit:
        return size - piece.endswith(b"\n")
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _json_line(raw: bytes, number: int, label: str) -> Any:
    where = f"{label} line {number}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = len(raw[: exc.start].decode("utf-8", "replace")) + 1
        return BadRecord(number, f"{where}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {column})")
    # json.loads recurses: a deep record is refused first (counting brackets is cheap, scanning is not)
    if text.count("[") + text.count("{") > MAX_DEPTH and json_too_deep_at(text) is not None:
        return BadRecord(number, f"{where}: nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:  # its own column would count past the line's end as a line 2
        column = min(exc.pos, len(text.rstrip("\r\n"))) + 1
        return BadRecord(number, f"{where}: not JSON ({exc.msg}, column {column})")
    except ValueError as exc:  # a number of thousands of digits
        return BadRecord(number, f"{where}: not JSON ({str(exc).split(';')[0]})")
