"""The snapshot codec: shared-store values <-> msgpack bytes, keeping their types.

Round-trips None, bool, int (any size), float, str, bytes, list, dict (str or int keys), datetime,
date, tuple and set/frozenset (as themselves). Anything else cannot travel to a worker: `encode`
raises SnapshotError naming the key path and the type, before anything is enqueued.
Keys starting with `_cf_` are process-private and are dropped from snapshots (`snapshot_of`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import msgpack

from ir.errors import SnapshotError

PRIVATE_PREFIX = "_cf_"
_BIGINT, _DATETIME, _DATE, _TUPLE, _SET, _FROZENSET = 1, 2, 3, 4, 5, 6
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


def _default(obj: Any) -> Any:
    """Called by msgpack (strict_types) for anything that is not an exact native type."""
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):  # an int subclass (IntEnum) or an int beyond 64 bits
        if type(obj) is not int and _INT64_MIN <= obj <= _UINT64_MAX:
            return int(obj)
        return msgpack.ExtType(_BIGINT, str(int(obj)).encode())
    for base in (float, str, bytes, dict, list):  # subclasses (NodeError, StrEnum...) travel as their base
        if isinstance(obj, base) and not isinstance(obj, tuple):
            return base(obj)
    if isinstance(obj, dt.datetime):
        return msgpack.ExtType(_DATETIME, obj.isoformat().encode())
    if isinstance(obj, dt.date):
        return msgpack.ExtType(_DATE, obj.isoformat().encode())
    for code, kind in ((_TUPLE, tuple), (_FROZENSET, frozenset), (_SET, set)):
        if isinstance(obj, kind):
            return msgpack.ExtType(code, _packer().pack(list(obj)))
    raise TypeError(type(obj).__name__)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _BIGINT:
        return int(data.decode())
    if code == _DATETIME:
        return dt.datetime.fromisoformat(data.decode())
    if code == _DATE:
        return dt.date.fromisoformat(data.decode())
    if code in (_TUPLE, _SET, _FROZENSET):
        values = decode(data)
        return {_TUPLE: tuple, _SET: set, _FROZENSET: frozenset}[code](values)
    return msgpack.ExtType(code, data)


def _packer() -> msgpack.Packer:
    # strict_types: tuples and big ints must reach `_default` instead of being coerced silently.
    return msgpack.Packer(default=_default, use_bin_type=True, strict_types=True, datetime=False)


def encode(value: Any, *, label: str = "value") -> bytes:
    try:
        return _packer().pack(value)
    except (TypeError, ValueError, OverflowError):
        path, culprit = _find_unpackable(value, label)
        raise SnapshotError(
            f"{path}: a value of type {type(culprit).__name__} cannot travel to workers "
            "(allowed: None, bool, int, float, str, bytes, list, tuple, set, dict, datetime, date)"
        ) from None


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def reader(file_like: Any) -> msgpack.Unpacker:
    """An incremental decoder over a readable file: a large value is read piece by piece
    (`read_map_header`, `read_array_header`, `unpack`, `skip`), never decoded whole."""
    return msgpack.Unpacker(file_like, ext_hook=_ext_hook, raw=False, strict_map_key=False, max_buffer_size=2**31 - 1)


def snapshot_of(shared: Mapping[str, Any]) -> dict[str, Any]:
    """The shallow snapshot that travels: `dict(shared)` without process-private keys."""
    return {k: v for k, v in shared.items() if not (isinstance(k, str) and k.startswith(PRIVATE_PREFIX))}


def _find_unpackable(value: Any, path: str) -> tuple[str, Any]:
    """Walk a value that failed to pack and name the innermost part that cannot travel."""
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                return f"{path} key {key!r}", key
            children.append((f"{path}[{key!r}]", item))
    elif isinstance(value, list | tuple | set | frozenset):
        children = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    for child_path, child in children:
        try:
            _packer().pack(child)
        except (TypeError, ValueError, OverflowError):
            return _find_unpackable(child, child_path)
    return path, value
