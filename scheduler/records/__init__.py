"""The records of a dataset job (`--items FILE`): the workflow runs once per record.

jsonl: one JSON value per line. csv: a header row, then one dict of strings per row. json: one top-level
array, parsed as a stream (ijson). Blank lines are not records; a UTF-8 byte order mark is allowed.

Each format is a generator reading its file lazily, so a file of millions of records costs the memory of
one record and a small buffer, never of the file. A record that cannot be read is a `BadRecord` in its
place: `read_records` raises it as a ValidationError, or with `skip_bad` passes it on, so every later record
keeps its index (its position in the file). A record longer than `max_record_bytes` (16 MiB unless told) is such a
record, found without holding more than that cap of it: one line or row is read in bounded pieces.

A module per format (jsonl.py, csvrows.py, jsonarray.py) over base.py. May import `ir` and ijson; nothing else of
chordflow.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path, PurePath
from typing import Any

from ir.errors import ValidationError, shown
from scheduler.records import csvrows, jsonarray, jsonl
from scheduler.records.base import CHUNK_BYTES, MAX_RECORD_BYTES, BadRecord

__all__ = [
    "CHUNK_BYTES", "FORMATS", "MAX_RECORD_BYTES", "SUFFIXES", "BadRecord", "Items", "read_records", "record_format",
    "windows",
]  # fmt: skip

#: A dataset job's records: a file (JSONL, CSV, JSON array) or any iterable of records.
Items = str | Path | Iterable[Any]

#: The record formats, as `--format` names them.
FORMATS = ("jsonl", "csv", "json")
#: A file's format when `--format` is not given, by its extension (any case).
SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".json": "json"}


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


_READERS = {"jsonl": jsonl.read, "csv": csvrows.read, "json": jsonarray.read}
