"""What the readers of every record format share: a bad record in a good one's place, the size cap, the block size."""

from __future__ import annotations

from dataclasses import dataclass

#: How many bytes a reader takes from its file at a time.
CHUNK_BYTES = 64 * 1024
#: The largest record read unless `--max-record-bytes` says otherwise: its bytes in the file, line break aside.
MAX_RECORD_BYTES = 16 * 1024 * 1024
#: A UTF-8 byte order mark, allowed at the start of a file.
BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be read, yielded in its place by `read_records(..., skip_bad=True)`."""

    line: int  #: 1-based line of the file where the record starts
    error: str  #: one line naming the file and the line, as the ValidationError would say


def too_large(where: str, size: int, limit: int, more: bool = False, what: str = "record") -> str:
    return f"{where}: {what} is {'more than ' if more else ''}{size} bytes, over --max-record-bytes {limit}"
