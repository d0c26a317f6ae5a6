"""An `--inputs-file`, read once for every command: `read_whole` parses it (a local run needs the values), and
for a cluster run `read_encoded` takes each top-level value straight from JSON to the bytes the run's store
keeps in Redis (the snapshot codec), without ever building it as Python objects.

A run submitted with a million items as an input then costs the submitting client the encoded bytes
(a few MB), not the parsed list (tens of MB). The JSON is read as a stream of parser events (ijson's C
backend); containers are encoded bottom-up, since msgpack writes a container's length before its items.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import ijson
import msgpack

from ir import snapshot
from ir.errors import ValidationError
from ir.limits import MAX_DEPTH, check_json_text, too_deep


class _Container:
    """A map or an array being encoded: its items so far (a map's keys and values), and how many."""

    __slots__ = ("body", "count", "is_map")

    def __init__(self, is_map: bool):
        self.is_map, self.count, self.body = is_map, 0, io.BytesIO()

    def encoded(self, packer: msgpack.Packer) -> bytes:
        header = packer.pack_map_header(self.count) if self.is_map else packer.pack_array_header(self.count)
        return header + self.body.getvalue()


def read_encoded(path: str | Path, label: str = "--inputs-file") -> dict[str, bytes]:
    """The top-level keys of a JSON object file -> each value encoded with the snapshot codec.

    Raises ValidationError (one line naming the file) for a missing or unreadable file, invalid JSON,
    a top level that is not an object, or nesting deeper than ir.limits.MAX_DEPTH.
    """
    path = Path(path)
    where = f"{label} {path}"
    try:
        with path.open("rb") as f:
            return _transcode(f, where, str(path))
    except FileNotFoundError:
        raise ValidationError(f"{where}: file not found") from None
    except ijson.JSONError:  # invalid JSON, or valid JSON the stream parser refuses (an int beyond 64 bits)
        return {key: snapshot.encode(value, label=f"{where}: {key}") for key, value in read_whole(path, label).items()}
    except OSError as exc:
        raise ValidationError(f"{where}: cannot read: {exc.strerror or exc}") from None


def _transcode(f: Any, where: str, depth_label: str) -> dict[str, bytes]:
    packer = msgpack.Packer(use_bin_type=True)
    events = ijson.parse(f, use_float=True)
    first = next(events, None)
    if first is None or first[1] != "start_map":
        got = _KINDS.get(first[1], "list") if first else "nothing"
        raise ValidationError(f"{where}: expected a JSON object, got {got}")
    encoded: dict[str, bytes] = {}
    stack = [_Container(True)]  # the top-level object: its values are not nested in it, they are `encoded`
    key = ""  # the top-level key whose value is being read

    def done(value: bytes) -> None:
        if len(stack) == 1:
            encoded[key] = value
        else:
            stack[-1].body.write(value)
            stack[-1].count += 1

    for _prefix, event, value in events:  # scalars are 'null', 'boolean', 'number' (int or float), 'string'
        if event in ("start_map", "start_array"):
            if len(stack) > MAX_DEPTH:  # the stack holds the top-level object too: each value may be MAX_DEPTH deep
                raise too_deep(depth_label)
            stack.append(_Container(event == "start_map"))
        elif event in ("end_map", "end_array"):
            finished = stack.pop()
            if stack:
                done(finished.encoded(packer))
        elif event == "map_key":
            if len(stack) == 1:
                key = value
            else:
                stack[-1].body.write(packer.pack(value))
        else:
            done(packer.pack(value))
    return encoded


_KINDS = {"start_array": "list", "string": "str", "number": "number", "boolean": "bool", "null": "NoneType"}


def read_whole(path: str | Path, label: str = "--inputs-file") -> dict[str, Any]:
    """The inputs file parsed whole: what a local run needs (the values themselves), and the slow path for
    what the stream parser refuses. `json` reports where the text is invalid (line and column)."""
    path = Path(path)
    where = f"{label} {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{where}: file not found") from None
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValidationError(f"{where}: cannot read: {exc.strerror or exc}") from None
    check_json_text(text, str(path), values_inside=True)  # before json.loads, which would recurse
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{where}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # a number of thousands of digits
        raise ValidationError(f"{where}: {exc}") from None
    if not isinstance(data, dict):
        raise ValidationError(f"{where}: expected a JSON object, got {type(data).__name__}")
    return data
