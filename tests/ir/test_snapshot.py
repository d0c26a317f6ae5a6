"""The snapshot codec: types survive msgpack; values that cannot travel fail early with their key."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ir import snapshot
from ir.errors import SnapshotError
from worker.node_error import NodeError


def test_round_trips_every_supported_type() -> None:
    value = {
        "none": None,
        "flag": True,
        "small": -3,
        "u64": 2**64 - 1,
        "big": 2**200,
        "negbig": -(2**90),
        "pi": 3.25,
        "text": "héllo",
        "raw": b"\x00\xff",
        "list": [1, [2, {"k": "v"}]],
        "int_keys": {1: "one", 2: {"x": None}},
        "aware": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "naive": dt.datetime(2024, 1, 1, 0, 0),
        "day": dt.date(2020, 2, 29),
        "tuple": (1, "a", (2,)),
        "set": {1, 2, 3},
        "frozen": frozenset({"a"}),
    }
    back = snapshot.decode(snapshot.encode(value))
    assert back == value
    assert type(back["tuple"]) is tuple and type(back["tuple"][2]) is tuple
    assert type(back["set"]) is set and type(back["frozen"]) is frozenset
    assert back["aware"].utcoffset() == dt.timedelta(hours=2)


def test_subclasses_travel_as_their_base_type() -> None:
    error = NodeError(message="boom", exception_type="ValueError")
    back = snapshot.decode(snapshot.encode({"_error": error}))
    assert back == {"_error": {"message": "boom", "exception_type": "ValueError"}}


def test_value_that_cannot_travel_names_key_path_and_type() -> None:
    class Handle:
        pass

    with pytest.raises(SnapshotError) as caught:
        snapshot.encode({"ok": 1, "node": {"files": [1, Handle()]}}, label="shared")
    message = str(caught.value)
    assert "shared['node']['files'][1]" in message
    assert "Handle" in message


def test_private_keys_never_travel() -> None:
    shared = {"data": 1, "_cf_lock": object(), "_error": None}
    assert snapshot.snapshot_of(shared) == {"data": 1, "_error": None}


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_like)
def test_round_trip_property(value: object) -> None:
    assert snapshot.decode(snapshot.encode(value)) == value
