"""A run's record and its vocabulary: what `status`, `runs` and `resume` read, whichever store recorded
it; the RunResult a finished run gives its caller; the one mapping between the two status words."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ir.errors import Fenced, NewerFormat
from worker.waits import Waiting

#: The record format this release writes (`format` in every run record); it reads every one up to it. Format 0:
#: a record written before formats were numbered.
FORMAT = 1
#: Statuses a run record goes through; the last three are final.
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL = ("succeeded", "failed", "cancelled")
#: RunResult.status (the `scheduler.run` contract says "success") -> the run record's status ("succeeded").
RECORD_STATUS = {"success": "succeeded", "failed": "failed", "cancelled": "cancelled"}
#: The run record's status -> RunResult.status.
RESULT_STATUS = {record: result for result, record in RECORD_STATUS.items()}


@dataclass
class RunResult:
    """What a finished run gives its caller (`scheduler.run`, `wait`, `resume`)."""

    shared: dict[str, Any]
    status: str  # "success" | "failed" | "cancelled"
    error: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    duration_s: float = 0.0


#: What a run id may be: `new_run_id`'s 12 hex digits, or one given to `scheduler.run(run_id=...)`.
RUN_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")
RUN_ID_RULE = "letters, digits, '.', '_' and '-', at most 128 characters"


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def valid_run_id(run_id: object) -> bool:
    """Whether `run_id` can name a run (checked before any lookup by the CLI and the dashboard)."""
    return isinstance(run_id, str) and RUN_ID_RE.fullmatch(run_id) is not None


def error_at(error: str, node: str | None) -> str:
    """A failed run's error as every command shows it (`run`, `wait`, `status`, `status --json`; local or cluster):
    the error, then the node it was raised at, ` (node 'b')`. Not when the error names the node already, nor for a
    parallel section (`<fork>:parallel`, where a fan-in's fail_fast fails a run: no node of the workflow, whose ids
    hold no ':'; the failed branch's own error says what failed)."""
    if node is None or ":" in node or f"'{node}'" in error:
        return error
    return f"{error} (node '{node}')"


def resume_refusal(record: RunRecord, workflow: Any = None) -> str | None:
    """Why `resume` refuses the run, or None: it must have ended failed or cancelled (with an edited `workflow`,
    succeeded too), not be a dataset job, which goes on with `redrive` (its records have no checkpoint), and not be
    recorded by a newer release (its record would be misread)."""
    if record.format > FORMAT:
        return (
            f"run {record.run_id} was recorded by a newer chordflow (record format {record.format}; this one reads "
            f"up to {FORMAT}): resume it with that release"
        )
    if record.dataset is not None:
        return (
            f"run {record.run_id} is a dataset job (--items): `chordflow redrive {record.run_id}` runs its failed "
            "and unfinished records again"
        )
    resumable = ("failed", "cancelled") if workflow is None else ("failed", "cancelled", "succeeded")
    if record.status not in resumable:
        return f"run {record.run_id} is {record.status}; only a failed or cancelled run can be resumed"
    return None


@dataclass
class RunRecord:
    run_id: str
    workflow: dict[str, Any]  # the validated IR, as wire JSON
    backend: str
    status: str = "queued"
    node: str | None = None  # the next node to run (while running: the one running)
    step: int = 0  # steps completed
    error: str | None = None
    created: float = 0.0
    updated: float = 0.0
    source: str | None = None  # the workflow file it came from, if any
    batches: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> {total, done, failed}
    dataset: dict[str, Any] | None = None  # a dataset job (worker/datasets/job.py Dataset), else None
    signature: str | None = None  # a cluster run's: of its workflow and dataset (worker/cluster/signing.py)
    updates: list[dict[str, Any]] = field(default_factory=list)  # `chordflow update`s: [{at, changes}], oldest first
    priority: str = "normal"  # a cluster run's (ir/priorities.py): its chunks' and advances' place in the queue
    format: int = FORMAT  # the record format it was written in
    waiting: dict[str, Any] | None = None  # what a `wait` node waits for (worker/waits.py Waiting), if it waits
    trace: str | None = None  # a traced cluster run's span (worker/tracing.py Later), ended with the run

    def _waiting(self) -> dict[str, Any]:
        w = self.waiting or {}
        shown = {"node": w.get("node"), "until": w.get("due"), "event": w.get("event"), "text": self.waits}
        if w.get("batches"):  # provider batches: each one's counts, and the deadline
            shown |= {"provider_batches": w["batches"], "deadline": w.get("deadline")}
        return shown

    @property
    def waits(self) -> str | None:
        """`waiting until 06:00:00 UTC`, `waiting for event 'approved'`: a running run at a wait, else None."""
        return Waiting.from_wire(self.waiting).describe() if self.waiting and self.status == "running" else None

    def check_format(self) -> None:
        """NewerFormat when a newer release wrote this record: a worker of this one leaves its run alone."""
        if self.format > FORMAT:
            raise NewerFormat(f"run {self.run_id}: record format {self.format}; this release reads up to {FORMAT}")

    @property
    def name(self) -> str:
        return str(self.workflow.get("name") or self.source or "workflow")

    def status_dict(self) -> dict[str, Any]:
        """The `chordflow status --json` object."""
        return {
            "run_id": self.run_id,
            "status": self.status,
            "node": self.node,
            "steps": self.step,
            "batches": self.batches,
            "error": error_at(self.error, self.node) if self.status == "failed" and self.error else self.error,
            "created": self.created,
            "updated": self.updated,
            "workflow": self.name,
            "backend": self.backend,
            "dataset": self.dataset,
            "updates": self.updates,
            "priority": self.priority,
            **({"waiting": self._waiting()} if self.waits else {}),
        }


@dataclass(frozen=True)
class TrailStep:
    """One completed step as its checkpoint recorded it: the node, the action it returned, and the hashes
    of its configuration and of the values it read (worker/engine/config_hash.py). `config` is None for a step
    recorded before checkpoints kept hashes (such a step cannot be rolled back either)."""

    node: str
    action: str | None = None
    config: str | None = None
    reads: str | None = None


def trail_action(action: Any) -> str:
    """A step's action as the trail keeps it (what the flow followed: None is `default`)."""
    return "default" if action is None else str(action)


class StepJournal:
    """The stepper's journal for a recorded run: each step to its run store, with batch counts."""

    def __init__(self, runs: Any, run_id: str, batch_nodes: set[str]):
        self.runs, self.run_id, self.batch_nodes = runs, run_id, batch_nodes

    def checkpoint(self, step: int, result: Any) -> None:
        """Record the step; Fenced when the run is no longer at it (another process went on from its checkpoint):
        nothing after this node may run here."""
        counts = None
        aggregate = result.changed.get(result.node) if result.node in self.batch_nodes else None
        if isinstance(aggregate, dict) and "count" in aggregate:
            counts = {"total": aggregate["count"], "done": aggregate["count"], "failed": aggregate["error_count"]}
        if not self.runs.checkpoint(self.run_id, step, result, counts):
            raise Fenced(f"run {self.run_id}: step {step} ({result.node}) was taken over by another worker; stopping")
