"""json: one top-level array, parsed as a stream (ijson): a file of millions of records costs one record's memory."""

from __future__ import annotations

import json
import operator
import re
import stat
from collections.abc import Iterator
from itertools import accumulate, chain, count, islice
from pathlib import Path
from typing import Any

import ijson

from ir.errors import ValidationError
from ir.limits import MAX_DEPTH
from scheduler.records.base import BOM, CHUNK_BYTES, BadRecord, too_large

_JSON_SPACE = b" \t\r\n"
#: What a json file holds when its first character is not `[`.
_KINDS = {ord("{"): "object", ord('"'): "string", ord("t"): "boolean", ord("f"): "boolean", ord("n"): "null"}
_KINDS.update(dict.fromkeys(b"-0123456789", "number"))


class _IntegerBeyond64Bits(Exception):
    """The C parser met an integer it cannot hold: the pure-Python parser takes over."""


_C_PARSER = ijson  # ijson's default backend: its C one (yajl2_c) when built
_PY_PARSER = ijson.get_backend("python")
_PARSE_ERRORS = (ijson.JSONError, UnicodeDecodeError)  # the Python parser decodes UTF-8 itself


def read(path: Path, label: str, limit: int) -> Iterator[Any]:
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
                    yield BadRecord(source.position.line, too_large(where, size, limit, what=f"record {index}"))
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
    if chunk.startswith(BOM):
        chunk = chunk[len(BOM) :] or f.read(CHUNK_BYTES)
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
            raise ValidationError(f"{too_large(where, over, self.limit, more=True)} (a json file stops there)")
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
