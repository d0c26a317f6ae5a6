"""What crosses the broker: one frozen dataclass per message kind, each with `to_wire` (the task's arguments) and
`from_wire` (what its task calls in its first line), and the header a batch's chunks share, kept with its window.

Every message carries the wire format it was written in (`v`, FORMAT). A worker reads every format up to its own:
format 0 is the one before formats were numbered (an advance's positional `(run_id, step)`, a chunk's and a merge's
dicts without `v`), still read so that messages in flight across an upgrade run. A message of a newer format
raises NewerFormat: the task hands it back to the broker for a worker that knows it (worker/cluster/app.py
KnowsFormat), never misreading or dropping it. A run record carries its format too (worker/cluster/state/runs.py).

Task names live here with their messages; sending is worker/cluster/sending.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ir.errors import NewerFormat

#: The wire format this release writes; it reads every one up to it.
FORMAT = 1

ADVANCE = "chordflow.advance"
ADVANCE_BRANCH = "chordflow.advance_branch"
RUN_CHUNK = "chordflow.run_chunk"
MERGE = "chordflow.aggregate"
DATASET_CHUNK = "chordflow.dataset_chunk"


def check_format(wire: Mapping[str, Any], what: str) -> int:
    """The format `wire` was written in; NewerFormat when this release cannot read it."""
    found = wire.get("v", 0)
    if not isinstance(found, int) or found > FORMAT:
        raise NewerFormat(f"{what} of wire format {found!r}: this worker reads formats up to {FORMAT}")
    return found


@dataclass(frozen=True)
class Advance:
    """`chordflow.advance`: go on with a run from the step it checkpointed."""

    name: ClassVar[str] = ADVANCE

    run: str
    step: int

    def to_wire(self) -> tuple[dict[str, Any]]:
        return ({"v": FORMAT, "run": self.run, "step": self.step},)

    @classmethod
    def from_wire(cls, message: Any, *legacy: Any) -> Advance:
        if isinstance(message, str):  # format 0: (run_id, step)
            return cls(message, int(legacy[0]))
        check_format(message, "an advance")
        return cls(message["run"], int(message["step"]))


@dataclass(frozen=True)
class AdvanceBranch:
    """`chordflow.advance_branch`: go on with one branch of a parallel section (`section`: its key)."""

    name: ClassVar[str] = ADVANCE_BRANCH

    run: str
    section: str
    branch: str
    step: int

    def to_wire(self) -> tuple[dict[str, Any]]:
        return ({"v": FORMAT, "run": self.run, "section": self.section, "branch": self.branch, "step": self.step},)

    @classmethod
    def from_wire(cls, message: Any, *legacy: Any) -> AdvanceBranch:
        if isinstance(message, str):  # format 0: (run_id, section, branch, step)
            section, branch, step = legacy
            return cls(message, section, branch, int(step))
        check_format(message, "a branch's advance")
        return cls(message["run"], message["section"], message["branch"], int(message["step"]))


@dataclass(frozen=True)
class DatasetChunk:
    """`chordflow.dataset_chunk`: run chunk `n` of a dataset job's records."""

    name: ClassVar[str] = DATASET_CHUNK

    run: str
    n: int

    def to_wire(self) -> tuple[dict[str, Any]]:
        return ({"v": FORMAT, "run": self.run, "n": self.n},)

    @classmethod
    def from_wire(cls, message: Any, *legacy: Any) -> DatasetChunk:
        if isinstance(message, str):  # format 0: (run_id, n)
            return cls(message, int(legacy[0]))
        check_format(message, "a records chunk")
        return cls(message["run"], int(message["n"]))


@dataclass(frozen=True)
class Merge:
    """`chordflow.aggregate`, the merge task: merge batch `batch` of node `node` (`count` items) once its chunks
    are done, then send what goes on — `advance` (the step of a run the workers drive), in branch `branch` (section
    key, branch) of a parallel section; neither: a client waits for the result. `snapshot`: the key of a store
    snapshot too large for the chunk messages, deleted by the merge."""

    name: ClassVar[str] = MERGE

    run: str
    batch: str
    node: str
    count: int
    fail_fast: bool
    advance: int | None = None
    branch: tuple[str, str] | None = None
    snapshot: str | None = None
    trace: str | None = None  # the batch's span (worker/tracing.py Later): the merge ends it

    def to_wire(self) -> tuple[dict[str, Any]]:
        return (self.fields(),)

    def fields(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "v": FORMAT, "run": self.run, "batch": self.batch, "node": self.node, "count": self.count,
            "fail_fast": self.fail_fast,
        }  # fmt: skip
        if self.advance is not None:
            wire["advance"] = self.advance
        if self.branch is not None:
            wire["branch"] = list(self.branch)
        if self.snapshot is not None:
            wire["snapshot"] = self.snapshot
        if self.trace is not None:
            wire["trace"] = self.trace
        return wire

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Merge:
        check_format(wire, "a merge")
        branch = wire.get("branch")
        return cls(
            wire["run"], wire["batch"], wire["node"], int(wire["count"]), bool(wire["fail_fast"]),
            wire.get("advance"), None if branch is None else (branch[0], branch[1]), wire.get("snapshot"),
            wire.get("trace"),
        )  # fmt: skip

    def next_advance(self) -> Advance | AdvanceBranch | None:
        """What goes on once the batch is merged: the run's (or branch's) advance; None: a client waits."""
        if self.advance is None:
            return None
        if self.branch is not None:
            return AdvanceBranch(self.run, *self.branch, self.advance)
        return Advance(self.run, self.advance)


@dataclass(frozen=True)
class Header:
    """What every chunk of one batch shares, stored with its window when it is planned (the window's `header`):
    the node's spec (wire), the store's snapshot (inline bytes, or `{"ref": key}` of one stored in Redis), the
    merge to send when its chunks are done, and the plan's id (a chunk of an older plan of the batch is stale)."""

    node: dict[str, Any]
    snap: bytes | dict[str, str]
    merge: Merge
    plan: str

    def to_wire(self) -> dict[str, Any]:
        return {"v": FORMAT, "node": self.node, "snap": self.snap, "meta": self.merge.fields(), "plan": self.plan}

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Header:
        check_format(wire, "a batch's header")
        return cls(wire["node"], wire["snap"], Merge.from_wire(wire["meta"]), wire["plan"])

    def chunk(self, start: int, *, items: list[bytes] | None = None, blocks: list[int] | None = None) -> Chunk:
        return Chunk(self.merge.run, self.merge.batch, self.node, self.snap, start, self.plan, items, blocks,
                     self.merge.trace)  # fmt: skip


@dataclass(frozen=True)
class Chunk:
    """`chordflow.run_chunk`: run the items of batch `batch` from `start`: `items`, its blocks of encoded items; or
    `blocks`, their numbers in the window (a copy sent by aging: worker/cluster/aging.py), read from there."""

    name: ClassVar[str] = RUN_CHUNK

    run: str
    batch: str
    node: dict[str, Any]
    snap: bytes | dict[str, str]
    start: int
    plan: str
    items: list[bytes] | None = None
    blocks: list[int] | None = None
    trace: str | None = None  # its batch's span (worker/tracing.py Later): the chunk's parent

    def to_wire(self) -> tuple[dict[str, Any]]:
        wire: dict[str, Any] = {
            "v": FORMAT, "run": self.run, "batch": self.batch, "node": self.node, "snap": self.snap,
            "start": self.start, "plan": self.plan,
        }  # fmt: skip
        if self.items is not None:
            wire["items"] = self.items
        else:
            wire["blocks"] = self.blocks
        if self.trace is not None:
            wire["trace"] = self.trace
        return (wire,)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> Chunk:
        check_format(wire, "a chunk")
        return cls(
            wire["run"], wire["batch"], wire["node"], wire["snap"], int(wire["start"]), wire["plan"],
            wire.get("items"), wire.get("blocks"), wire.get("trace"),
        )  # fmt: skip


#: A message of any kind.
Message = Advance | AdvanceBranch | DatasetChunk | Merge | Chunk


def run_of(args: tuple[Any, ...]) -> str | None:
    """The run a chordflow task's arguments belong to (any format): its first argument, or that message's `run`."""
    first = args[0] if args else None
    return first if isinstance(first, str) else first.get("run") if isinstance(first, dict) else None
