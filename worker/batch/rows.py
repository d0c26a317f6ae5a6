"""A finished batch's items as rows `{"index", "result", "error"}` in input order, read piece by piece.

`chordflow results RUN --node N` streams a batch of any size: a cluster run's rows come from the chunk
outcomes the merge task stored per chunk (one chunk decoded at a time), a local run's from the stored
aggregate, decoded incrementally. Neither builds the item list in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

import msgpack

from ir import snapshot
from worker.batch.aggregate import ChunkResult

Row = dict[str, Any]


def rows_of_chunks(chunks: Iterable[ChunkResult]) -> Iterator[Row]:
    """Rows of chunks given in index order (the chunks a batch's aggregate was merged from)."""
    for chunk in chunks:
        errors = {failure.index: failure.error for failure in chunk.failures}
        for offset, result in enumerate(chunk.results):
            index = chunk.start + offset
            yield {"index": index, "result": result, "error": errors.get(index)}


def rows_of_aggregate(open_blob: Callable[[], BinaryIO]) -> Iterator[Row]:
    """Rows of an aggregate stored whole (`{"results": [...], ..., "errors": [...]}`, snapshot codec).

    `open_blob()` returns a fresh readable binary file over the stored bytes. Two passes: the first (now)
    skips the results to find the (few) errors and raises LookupError when the value is no aggregate;
    the second (as rows are read) streams the results with their errors beside them.
    """
    with open_blob() as blob:
        try:
            entries = _errors(snapshot.reader(blob))
        except (ValueError, msgpack.UnpackException) as exc:  # not a map, or not msgpack at all
            raise LookupError("the stored value is not a batch aggregate") from exc
    errors = {entry["index"]: entry["error"] for entry in entries or []}
    return _stream(open_blob, errors)


def _stream(open_blob: Callable[[], BinaryIO], errors: dict[int, str]) -> Iterator[Row]:
    with open_blob() as blob:
        reader = snapshot.reader(blob)
        for index in range(_seek_results(reader)):
            yield {"index": index, "result": reader.unpack(), "error": errors.get(index)}


def _errors(reader: Any) -> list[dict[str, Any]] | None:
    """The aggregate's `errors` entry, skipping over the results without decoding them."""
    found, has_results = None, False
    for _ in range(reader.read_map_header()):
        key = reader.unpack()
        if key == "errors":
            found = reader.unpack()
        elif key == "results":
            has_results = True
            for _ in range(reader.read_array_header()):
                reader.skip()
        else:
            reader.skip()
    if not has_results:
        raise LookupError("the stored value is not a batch aggregate")
    return found


def _seek_results(reader: Any) -> int:
    """Position `reader` at the first result; returns how many there are."""
    for _ in range(reader.read_map_header()):
        if reader.unpack() == "results":
            return reader.read_array_header()
        reader.skip()
    raise LookupError("the stored aggregate has no results")
