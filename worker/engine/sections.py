"""Running a parallel section (ir/branches.py) and merging its branches at the fan-in.

Each branch runs on its own shallow copy of the store, driven by the same stepper up to the fan-in. Here
the branches are threads of this process (the local backend, and a client-orchestrated celery run whose
batches still go to the workers as chunks); a cluster run forks them into cursors of their own
(worker/cluster/advance.py).
Both end in `merged`: the namespaces every branch wrote go into the store, root-level keys written by
several branches are taken in branch declaration order (the last one's value stays, with a warning), and
`__parallel_results__` lists each branch's outcome in declaration order. A branch that raises stops that
branch only; with `fan_in_error_handling: fail_fast` the first failure stops the others and fails the run.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ir import snapshot
from ir.branches import Section
from ir.errors import SnapshotError
from worker.engine.steps import Step

log = logging.getLogger(__name__)
RESULTS_KEY = "__parallel_results__"


@dataclass
class BranchState:
    """Where one branch stands: its cursor, what it changed in the store so far, and how it ended."""

    branch: str
    node: str | None
    step: int = 0
    status: str = "running"  # running | done | failed | cancelled
    error: str | None = None
    changed: dict[str, Any] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    kind: list[str] | None = None  # a failure's [module, type, message]: the cluster raises it again at the fan-in
    exception: BaseException | None = None  # in-process only

    @property
    def finished(self) -> bool:
        """Done: a resumed section keeps it; a failed or cut-short branch runs again from where it stood."""
        return self.status == "done"

    def record(self, result: Step) -> None:
        """Fold one step of the branch into what it changed."""
        for key in result.deleted:
            self.changed.pop(key, None)
            self.deleted.append(key)
        self.changed.update(result.changed)

    def to_wire(self) -> list[Any]:
        return [self.branch, self.node, self.step, self.status, self.error, self.changed, self.deleted, self.kind]

    @classmethod
    def from_wire(cls, data: list[Any]) -> BranchState:
        return cls(*data)


class BranchJournal(Protocol):
    """Where branch progress is kept, so a resumed run does not run a finished branch again."""

    def load(self, key: str) -> dict[str, BranchState]: ...

    def save(self, key: str, state: BranchState) -> None: ...


class StoredBranches:
    """A BranchJournal in a run's store (`load_branches` / `save_branch` / `forget_branches` of LocalRuns or
    ClusterRuns). A branch whose store values cannot be encoded is not kept: a resume runs it again."""

    def __init__(self, runs: Any, run_id: str):
        self.runs, self.run_id = runs, run_id

    def load(self, key: str) -> dict[str, BranchState]:
        return {b: BranchState.from_wire(w) for b, w in self.runs.load_branches(self.run_id, key).items()}

    def save(self, key: str, state: BranchState) -> None:
        try:
            blob = snapshot.encode(state.to_wire(), label=f"branch '{state.branch}'")
        except SnapshotError:
            return
        self.runs.save_branch(self.run_id, key, state.branch, blob)


class BranchSink:
    """A branch's events as docs/ARCHITECTURE.md names them: `parallel_state` / `parallel_error`, with the branch."""

    def __init__(self, sink: Callable[[dict[str, Any]], None] | None, branch: str):
        self.sink, self.branch = sink, branch
        self.erred = False  # a `parallel_error` was sent (a node raised)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "state":
            event = {"type": "parallel_state", "branch": self.branch, "node": event["node"], "state": event["state"]}
        elif kind in ("error", "parallel_error"):
            self.erred = True
            event = {"type": "parallel_error", "branch": self.branch, "node": event["node"], "error": event["error"]}
        else:
            event = {**event, "branch": self.branch}
        if self.sink is not None:
            self.sink(event)


class StopFlag(threading.Event):
    """An event that also reads as set when `stopped()` says so: a branch's stop (the run cancelled, or its
    section stopped by fail_fast), as its stepper and batches read it, whether held in memory or in Redis."""

    def __init__(self, stopped: Callable[[], bool]):
        super().__init__()
        self.stopped = stopped

    def is_set(self) -> bool:
        return super().is_set() or self.stopped()


class BranchSteps:
    """A branch's stepper journal, in-process and on the cluster: folds each step into the branch state,
    then hands it to `save` (when the branch is kept somewhere)."""

    def __init__(self, state: BranchState, save: Callable[[BranchState], None] | None = None):
        self.state, self.save = state, save

    def checkpoint(self, step: int, result: Step) -> None:
        self.state.record(result)
        self.state.node, self.state.step = result.next_node, step + 1
        if self.save is not None:
            self.save(self.state)


def merged(section: Section, states: list[BranchState]) -> Step:
    """The section as one step of the run: the branches' writes in declaration order, and their results."""
    changed: dict[str, Any] = {}
    writers: dict[str, list[str]] = {}
    for state in states:
        for name, value in state.changed.items():
            if name == RESULTS_KEY:
                continue
            changed[name] = value
            writers.setdefault(name, []).append(state.branch)
    for name, branches in writers.items():
        if len(branches) > 1 and section.branch_of(name) is None:
            log.warning(
                "root key '%s' is written by branches %s: the value of '%s' (declared last) is kept",
                name, ", ".join(f"'{b}'" for b in branches), branches[-1],
            )  # fmt: skip
    changed[RESULTS_KEY] = [
        {
            "branch": s.branch,
            "ok": s.status == "done",
            "error": s.error,
            "state": {n: v for n, v in s.changed.items() if n in section.members[s.branch]},
        }
        for s in states
    ]
    return Step(section.node_id, "default", section.fan_in, changed, [])
