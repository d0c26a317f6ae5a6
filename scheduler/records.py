"""The records of a dataset job (`--items FILE`): the workflow runs once per record.

jsonl: one JSON value per line. csv: a header row, then one dict of strings per row. json: one top-level
array, parsed as a stream (ijson). Blank lines are not records; a UTF-8 byte order mark is allowed.

Each format is a generator reading its file lazily, so a file of millions of records costs the memory of
one record and a small buffer, never of the file. A record that cannot be read is a `BadRecord` in its
place: `read_records` raises it as a ValidationError, or with `skip_bad` passes it on, so every later record
keeps its index (its position in the file). A record longer than `max_record_bytes` (16 MiB unless told) is such a
record, found without holding more than that cap of it: one line or row is read in bounded pieces.
"""

from __future__ import annotations

import csv
import json
import operator
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import accumulate, chain, count, islice
from pathlib import Path, PurePath
from typing import Any

import ijson

from ir.errors import ValidationError, shown
from ir.limits import MAX_DEPTH, json_too_deep_at

#: A dataset job's records: a file (JSONL, CSV, JSON array) or any iterable of records.
Items = str | Path | Iterable[Any]

#: The record formats, as `--format` names them.
FORMATS = ("jsonl", "csv", "json")
#: A file's format when `--format` is not given, by its extension (any case).
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".json": "json"}
#: How many bytes the json reader hands its parser at a time.
CHUNK_BYTES = 64 * 1024
#: The largest record read unless `--max-record-bytes` says otherwise: its bytes in the file, line break aside.
MAX_RECORD_BYTES = 16 * 1024 * 1024

_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = b" \t\r\n"
#: What a json file holds when its first character is not `[`.
_KINDS = {ord("{"): "object", ord('"'): "string", ord("t"): "boolean", ord("f"): "boolean", ord("n"): "null"}
_KINDS.update(dict.fromkeys(b"-0123456789", "number"))
#: A byte of a csv line that is not UTF-8, as `errors="surrogateescape"` decodes it.
_UNDECODED = re.compile("[\udc80-\udcff]")


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be read, yielded in its place by `read_records(..., skip_bad=True)`."""

    line: int  #: 1-based line of the file where the record starts
    error: str  #: one line naming the file and the line, as the ValidationError would say


def record_format(path: str | os.PathLike[str], fmt: str | None = None) -> str:
    """'jsonl' | 'csv' | 'json': `fmt` when given (checked), else told by the file's extension."""
    if fmt is not None:
        if fmt.lower() not in FORMATS:
            raise ValidationError(f"--format {shown(fmt)}: unknown record format (use jsonl, csv or json)")
        return fmt.lower()
    label = os.fspath(path)
    suffix = PurePath(label).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValidationError(
            f"{label}: cannot tell the record format from the file name; pass --format jsonl, csv or json"
        )
    return SUFFIXES[suffix]


def read_records(
    source: str | os.PathLike[str] | Iterable[Any],
    fmt: str | None = None,
    *,
    skip_bad: bool = False,
    max_record_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[Any]:
    """The records of `source` in file order, read lazily.

    `source` is a path, or any iterable of records (the Python API: yielded as they are, `fmt` ignored).
    The format and whether the file can be opened are checked at once; a bad record raises ValidationError
    (one line naming the file and the line) when it is reached, unless `skip_bad`: then a BadRecord takes
    its place. A json file stops at its first problem whatever `skip_bad` says: after a syntax error a
    stream parser cannot find where the next record starts (so does a json record too large for the parser to
    finish without holding more than `max_record_bytes`; one it finished is a bad record like any other).
    """
    if not isinstance(source, str | os.PathLike):
        return iter(source)
    label = os.fspath(source)
    path = Path(source)
    try:  # first: a missing file or a directory says so, not that its name tells no format
        with path.open("rb"):
            pass
    except OSError as exc:
        raise _unreadable(label, exc) from None
    if max_record_bytes < 1:
        raise ValidationError(f"--max-record-bytes: must be 1 or more, got {max_record_bytes}")
    read = _READERS[record_format(source, fmt)]
    return _checked(read(path, label, max_record_bytes), label, skip_bad)


def windows(records: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of at most `size` records (only the last may be shorter)."""
    if size < 1:
        raise ValueError(f"window size must be at least 1, got {size}")
    records = iter(records)
    while window := list(islice(records, size)):
        yield window


def _checked(records: Iterator[Any], label: str, skip_bad: bool) -> Iterator[Any]:
    """`records` with each BadRecord raised (or passed on when `skip_bad`), and a failing read one clear error."""
    try:
        for record in records:
            if type(record) is BadRecord and not skip_bad:
                raise ValidationError(record.error)
            yield record
    except OSError as exc:
        raise _unreadable(label, exc) from None


def _unreadable(label: str, exc: OSError) -> ValidationError:
    if isinstance(exc, FileNotFoundError):
        return ValidationError(f"{label}: file not found")
    if isinstance(exc, IsADirectoryError):
        return ValidationError(f"{label}: is a directory, not a file")
    return ValidationError(f"{label}: cannot read: {exc.strerror or exc}")


# --- jsonl: one JSON value per line ---------------------------------------------------------------------


def _jsonl(path: Path, label: str, limit: int) -> Iterator[Any]:
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
                    record: Any = BadRecord(number, _too_large(f"{label} line {number}", raw, limit))
                elif not raw or raw.isspace():
                    blank.append(number)
                    continue
                else:
                    record = _parsed(raw)
                    if record is _LONG_WAY:
                        if number == 1 and raw.startswith(_BOM):
                            raw = raw[len(_BOM) :]
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


def _too_large(where: str, size: int, limit: int, more: bool = False, what: str = "record") -> str:
    return f"{where}: {what} is {'more than ' if more else ''}{size} bytes, over --max-record-bytes {limit}"


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


# --- csv: a header row, then one record per row -----------------------------------------------------------


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


def _csv(path: Path, label: str, limit: int) -> Iterator[Any]:
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
                row, lines.bad = [], _too_large(f"line {start}", exc.size, limit, exc.more)
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


# --- json: one top-level array ----------------------------------------------------------------------------


class _IntegerBeyond64Bits(Exception):
    """The C parser met an integer it cannot hold: the pure-Python parser takes over."""


_C_PARSER = ijson  # ijson's default backend: its C one (yajl2_c) when built
_PY_PARSER = ijson.get_backend("python")
_PARSE_ERRORS = (ijson.JSONError, UnicodeDecodeError)  # the Python parser decodes UTF-8 itself


def _json(path: Path, label: str, limit: int) -> Iterator[Any]:
    """The array's items, parsed as a stream by ijson's C parser.

    That parser refuses integers beyond 64 bits: at the first one the file is read again by ijson's
    pure-Python parser (about 15x slower), skipping the records already given.
    """
    given = 0
    try:
        for record in _json_array(path, label, _C_PARSER, limit):
            yield record
            given += 1
        return
    except _IntegerBeyond64Bits as exc:
        if not _rereadable(path):  # a pipe: what was read is gone
            raise ValidationError(str(exc)) from None
    yield from islice(_json_array(path, label, _PY_PARSER, limit), given, None)


def _json_array(path: Path, label: str, parser: Any, limit: int) -> Iterator[Any]:
    """The items as the parser gives them, each checked against `limit` as it comes: an item may be larger only
    when the bytes read since the chunk where the one before it ended are, and then its JSON text is measured."""
    with path.open("rb") as f:
        source = _JsonSource(_chunks(f), label, limit)
        try:
            for index, item in enumerate(parser.items(source, "item", use_float=True)):
                if source.fed - source.floor > limit and (size := _json_bytes(item)) > limit:
                    where = f"{label} after {source.position}"
                    yield BadRecord(source.position.line, _too_large(where, size, limit, what=f"record {index}"))
                else:
                    yield item
                source.floor = source.fed - len(source.last)  # the next item starts in this chunk or later
        except _PARSE_ERRORS as exc:
            raise _json_error(exc, path, label, parser, source) from None


def _json_bytes(value: Any) -> int:
    """The bytes of `value` as compact JSON text (what a record over the cap is measured by)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass"))


def _chunks(f: Any) -> Iterator[bytes]:
    """The bytes of a file, CHUNK_BYTES at a time, without a UTF-8 byte order mark."""
    chunk = f.read(CHUNK_BYTES)
    if chunk.startswith(_BOM):
        chunk = chunk[len(_BOM) :] or f.read(CHUNK_BYTES)
    while chunk:
        yield chunk
        chunk = f.read(CHUNK_BYTES)


class _JsonSource:
    """Chunks of a json file as a file its parser reads: the top level checked to be an array, each chunk's
    nesting checked before the parser sees it, and where the last chunk read starts (parsers say not)."""

    __slots__ = (
        "at_end", "chunks", "fed", "floor", "label", "last", "limit", "nesting", "position", "read_count", "started",
    )  # fmt: skip

    def __init__(self, chunks: Iterator[bytes], label: str, limit: int | None = None):
        self.chunks, self.label, self.limit = chunks, label, limit
        self.position, self.last = _Position(), b""
        self.read_count, self.at_end, self.started = 0, False, False  # non-empty chunks read; the end read
        self.fed, self.floor = 0, 0  # bytes handed over; where the item being parsed starts at the earliest
        self.nesting = _Nesting(MAX_DEPTH + 1)  # the array itself is one level

    def read(self, size: int) -> bytes:
        if size == 0:  # ijson asks whether the file gives bytes or text
            return b""
        # The parser asks for more only once it gave every item it finished: the one it is building started
        # within a chunk of `floor`. Past the cap by more than that, it is too large: stop before it is held.
        if self.limit is not None and (over := self.fed - self.floor - CHUNK_BYTES) > self.limit:
            where = f"{self.label} after {self.position}"
            raise ValidationError(f"{_too_large(where, over, self.limit, more=True)} (a json file stops there)")
        self.position.advance(self.last)
        self.last = chunk = next(self.chunks, b"")
        if not self.started and (text := chunk.lstrip(_JSON_SPACE)):
            self.started = True
            if text[0] in _KINDS:
                raise ValidationError(f"{self.label}: expected a JSON array of records, got {_KINDS[text[0]]}")
        if not chunk:
            if not self.started:
                raise ValidationError(f"{self.label}: expected a JSON array of records, got an empty file")
            self.at_end = True
            return chunk
        deep = self.nesting.feed(chunk)
        if deep is not None:
            self.position.advance(chunk[:deep])
            raise ValidationError(f"{self.label} {self.position}: a record nested deeper than {MAX_DEPTH} levels")
        self.read_count += 1
        self.fed += len(chunk)
        return chunk


def _json_error(exc: Exception, path: Path, label: str, parser: Any, source: _JsonSource) -> Exception:
    """What the parser's failure becomes: a ValidationError naming the line, or _IntegerBeyond64Bits."""
    if isinstance(exc, UnicodeDecodeError):
        reason = "not UTF-8"
    else:
        message = exc.args[0] if exc.args else ""
        message = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
        reason = re.sub(r"^(parse|lexical) error: |\.$| at \d+$", "", message.strip().split("\n")[0].strip())
    if source.at_end:
        return ValidationError(f"{label}: invalid JSON: the file ends inside the array")
    where = f"after {source.position}"
    if parser is _C_PARSER and reason == "integer overflow":
        return _IntegerBeyond64Bits(f"{label} {where}: an integer beyond 64 bits, in a file that cannot be read twice")
    if _rereadable(path):
        where = _locate(path, label, parser, source.read_count - 1) or where
    return ValidationError(f"{label} {where}: invalid JSON ({reason})")


def _locate(path: Path, label: str, parser: Any, failing: int) -> str | None:
    """`line L, column C` where `parser` fails: the file is parsed again, chunk `failing` handed over one
    byte at a time."""
    with path.open("rb") as f:
        chunks = _chunks(f)
        before = islice(chunks, failing)
        bytewise = (chunk[i : i + 1] for chunk in islice(chunks, 1) for i in range(len(chunk)))
        source = _JsonSource(chain(before, bytewise), label)
        try:
            for _event in parser.basic_parse(source, use_float=True):
                pass
        except _PARSE_ERRORS:
            return None if source.at_end else str(source.position)
    return None


def _rereadable(path: Path) -> bool:
    """Whether the file can be read again from its start (a regular file, not a pipe)."""
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


#: Every byte but UTF-8 continuation bytes (0x80-0xBF): deleting them leaves the continuation bytes.
_NOT_CONTINUATION = bytes(range(0x80)) + bytes(range(0xC0, 0x100))


def _characters(data: bytes) -> int:
    """How many characters UTF-8 `data` holds: its bytes but the continuation ones."""
    return len(data) - len(data.translate(None, _NOT_CONTINUATION))


class _Position:
    """The line and column of the next byte of a UTF-8 stream, moved on chunk by chunk."""

    __slots__ = ("column", "line")

    def __init__(self) -> None:
        self.line, self.column = 1, 1

    def advance(self, data: bytes) -> None:
        last = data.rfind(b"\n")
        if last < 0:
            self.column += _characters(data)
        else:
            self.line += data.count(b"\n")
            self.column = 1 + _characters(data[last + 1 :])

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


#: Every byte but the quote and the brackets.
_NOT_MARKS = bytes(b for b in range(256) if b not in b'"[]{}')
#: An opening bracket -> 2, a closing one -> 0: after i brackets the depth has moved by (their sum - i).
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")


class _Nesting:
    """How deeply a stream of JSON text nests, followed chunk by chunk with bytes operations (no parsing).

    The json reader checks each chunk before its parser sees it: ijson's C parser spends memory growing
    with the square of the depth (a 100 KB file of brackets would take gigabytes), and a record deeper
    than MAX_DEPTH is refused anyway.
    """

    __slots__ = ("depth", "escaped", "in_string", "limit")

    def __init__(self, limit: int):
        self.limit, self.depth, self.in_string, self.escaped = limit, 0, False, False

    def feed(self, chunk: bytes) -> int | None:
        """The offset in `chunk` of the first bracket deeper than the limit, or None (the chunk is passed)."""
        before = self.depth, self.in_string, self.escaped
        brackets = self._brackets(chunk)
        if not brackets:
            return None
        deepest = max(map(operator.sub, accumulate(brackets.translate(_STEPS)), count(1 - self.depth)))
        if deepest > self.limit:
            self.depth, self.in_string, self.escaped = before
            return self._deeper_at(chunk)
        self.depth += 2 * (brackets.count(b"[") + brackets.count(b"{")) - len(brackets)
        return None

    def _brackets(self, chunk: bytes) -> bytes:
        """The brackets of `chunk` outside strings, in order; the state moves past `chunk`."""
        if self.escaped:  # the chunk starts with the character a backslash escapes
            chunk, self.escaped = chunk[1:], False
        if b"\\" in chunk:  # escapes go: an escaped backslash first, so `\\"` keeps its quote
            chunk = chunk.replace(b"\\\\", b"").replace(b'\\"', b"")
            if chunk.endswith(b"\\"):
                chunk, self.escaped = chunk[:-1], True
        # two quotes side by side enclose nothing (an empty string, or nothing between two strings)
        marks = chunk.translate(None, _NOT_MARKS).replace(b'""', b"")
        if b'"' not in marks:
            return b"" if self.in_string else marks
        parts = marks.split(b'"')  # outside, inside, outside... a string; or the other way round
        brackets = b"".join(parts[1::2] if self.in_string else parts[::2])
        if len(parts) % 2 == 0:
            self.in_string = not self.in_string
        return brackets

    def _deeper_at(self, chunk: bytes) -> int | None:
        """The slow, exact walk of a chunk that goes too deep: where it does."""
        for offset, byte in enumerate(chunk):
            if self.escaped:
                self.escaped = False
            elif self.in_string:
                self.escaped, self.in_string = byte == 0x5C, byte != 0x22
            elif byte == 0x22:
                self.in_string = True
            elif byte in b"[{":
                self.depth += 1
                if self.depth > self.limit:
                    return offset
            elif byte in b"]}":
                self.depth -= 1
        return None


_READERS = {"jsonl": _jsonl, "csv": _csv, "json": _json}
