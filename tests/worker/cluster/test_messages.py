"""What crosses the broker (worker/cluster/messages.py): each kind of message goes to its task's arguments and back
unchanged; a message of the format before formats were numbered is still read; a newer one is refused, never
misread. In process: the cluster's handling of a refused message is tests/worker/cluster/test_redis_is_data.py's."""

from __future__ import annotations

from typing import Any

import pytest

from ir.errors import NewerFormat
from worker.cluster import messages
from worker.cluster.messages import Advance, AdvanceBranch, Chunk, DatasetChunk, Header, Merge

MERGE = Merge("r1", "b#2", "b", 9, False, advance=2, branch=("fork:parallel#1", "left"), snapshot="cf:{r1}:snap:x")
KINDS: list[Any] = [
    Advance("r1", 3),
    AdvanceBranch("r1", "fork:parallel#1", "left", 4),
    DatasetChunk("r1", 7),
    MERGE,
    Merge("r1", "b#2", "b", 9, True),
    Chunk("r1", "b#2", {"id": "b"}, b"snap", 0, "plan", items=[b"\x91\x01"]),
    Chunk("r1", "b#2", {"id": "b"}, {"ref": "cf:{r1}:snap:x"}, 4, "plan", blocks=[1, 2]),
]


@pytest.mark.parametrize("message", KINDS, ids=lambda m: type(m).__name__)
def test_each_message_goes_to_its_tasks_arguments_and_back(message: Any) -> None:
    args = message.to_wire()
    assert all(arg.get("v") == messages.FORMAT for arg in args)
    assert type(message).from_wire(*args) == message


def test_a_batchs_header_carries_its_merge_and_makes_its_chunks() -> None:
    header = Header({"id": "b"}, b"snap", MERGE, "plan")
    assert Header.from_wire(header.to_wire()) == header
    assert header.chunk(4, blocks=[1]) == Chunk("r1", "b#2", {"id": "b"}, b"snap", 4, "plan", blocks=[1])


def test_what_goes_on_after_a_merge() -> None:
    assert MERGE.next_advance() == AdvanceBranch("r1", "fork:parallel#1", "left", 2)
    assert Merge("r1", "b#2", "b", 9, False, advance=5).next_advance() == Advance("r1", 5)
    assert Merge("r1", "b#2", "b", 9, False).next_advance() is None  # a client waits for the result


def test_messages_written_before_formats_were_numbered_are_read() -> None:
    assert Advance.from_wire("r1", 3) == Advance("r1", 3)
    assert AdvanceBranch.from_wire("r1", "fork:parallel#1", "left", 4) == KINDS[1]
    assert DatasetChunk.from_wire("r1", 7) == DatasetChunk("r1", 7)
    old = {"run": "r1", "batch": "b#2", "node": "b", "count": 9, "fail_fast": False, "advance": 2}
    assert Merge.from_wire(old) == Merge("r1", "b#2", "b", 9, False, advance=2)
    chunk = {"run": "r1", "batch": "b#2", "node": {"id": "b"}, "snap": b"s", "start": 0, "plan": "p", "items": []}
    assert Chunk.from_wire(chunk).items == []
    assert messages.run_of(("r1", 3)) == messages.run_of((old,)) == "r1"


@pytest.mark.parametrize("message", KINDS, ids=lambda m: type(m).__name__)
def test_a_newer_message_is_refused_naming_its_format(message: Any) -> None:
    newer = {**message.to_wire()[0], "v": messages.FORMAT + 1, "field": "a newer release's"}
    with pytest.raises(NewerFormat, match=f"wire format {messages.FORMAT + 1}: this worker reads formats up to"):
        type(message).from_wire(newer)
