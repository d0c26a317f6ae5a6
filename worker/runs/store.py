"""The RunStore protocol: what every caller may ask of a run store, whichever it is.

Two stores implement it: the embedded one (worker/runs/sqlite.py, local runs) and Redis
(worker/cluster/state/runs.py, runs the workers drive). Callers never ask which one they hold; what
differs between them is a property of the protocol (`durable`). Logic shared by both — rewinding a run,
pruning old runs — is written once here over the primitives each store provides, as kombu writes its QoS once
over five.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from ir.errors import Unrecoverable
from worker.batch.aggregate import ChunkResult
from worker.batch.rows import Row
from worker.engine.steps import Step
from worker.runs.owner import Owner
from worker.runs.record import FINAL, RunRecord, TrailStep


class RunStore(Protocol):
    """Run records, checkpoints, branches kept mid-section, and batches' saved outcomes."""

    @property
    def durable(self) -> bool:
        """True: a run goes on without the process that started it (the cluster's workers drive it, and
        any process can follow, cancel or resume it). False: the process running it drives it."""
        ...

    @property
    def where(self) -> str:
        """Where the store lives, for messages (`~/.chordflow/runs.db`, `Redis`)."""
        ...

    def create(self, record: RunRecord, store: Mapping[str, Any], encoded: Mapping[str, bytes] | None = None) -> None:
        """Record a new run with its initial store (`encoded`: more keys, already snapshot-encoded)."""
        ...

    def get(self, run_id: str) -> RunRecord | None: ...

    def recent(self, status: str | None = None, limit: int = 20) -> list[RunRecord]: ...

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        """Up to `limit` ids of recorded runs that start with `prefix` (a run id given cut short)."""
        ...

    def set_status(self, run_id: str, status: str, error: str | None = None, node: str | None = None) -> None: ...

    def purge(self, run_id: str) -> None:
        """Delete everything the store holds of a run, its record too (`chordflow purge`; the caller checks that
        the run has ended). Nothing is left that names it but, in Redis, its tombstone (a task of the run still in
        flight writes nothing back: worker/cluster/state/keys.py); a run it does not hold is no error."""
        ...

    def exception(self, run_id: str) -> tuple[str, str, str] | None:
        """(module, type, message) of the exception a failed run raised, for `wait` to raise again."""
        ...

    def owner(self, run_id: str) -> Owner | None:
        """The process driving the run (a local run: worker/runs/owner.py); None when the workers drive it."""
        ...

    def signal(self, run_id: str, event: str, data: Any) -> None:
        """Keep `event` with its data until a wait of the run takes it (at once when one waits for it)."""
        ...

    def checkpoint(self, run_id: str, step: int, result: Step, batch: dict[str, int] | None = None) -> bool:
        """Record one finished step; False (nothing written) when the run is no longer at `step`."""
        ...

    def load_store(self, run_id: str) -> dict[str, Any]: ...

    def load_key(self, run_id: str, key: str) -> Any:
        """One top-level key of the run's store (None when it has none), read without the rest: the dashboard's
        `__llm_calls__` of each run it lists."""
        ...

    def trail(self, run_id: str) -> list[str]:
        """The nodes completed so far, in step order."""
        ...

    def steps(self, run_id: str) -> list[TrailStep]:
        """The steps completed so far, in order, with their actions and hashes."""
        ...

    def set_workflow(self, run_id: str, workflow: dict[str, Any], source: str | None, node: str | None) -> None:
        """Give a run an edited workflow and the node it goes on with (None: the flow has ended)."""
        ...

    def save_branch(self, run_id: str, section: str, branch: str, value: bytes) -> None: ...

    def load_branches(self, run_id: str, section: str) -> dict[str, Any]: ...

    def saved_chunks(self, run_id: str, batch: str) -> list[ChunkResult]:
        """The outcomes kept of a batch (`<node>#<step>`) cut short, chunk by chunk."""
        ...

    def save_chunks(
        self, run_id: str, batch: str, chunks: list[ChunkResult], counts: dict[str, int] | None = None
    ) -> None:
        """Keep outcomes of a batch (`<node>#<step>`) that its next dispatch does not run again (a redrive's
        succeeded items); `counts`: the batch's {total, done, failed} so far, where the store shows them."""
        ...

    def batch_rows(self, run_id: str, node: str) -> Iterator[Row]:
        """A finished batch node's items as rows, in input order."""
        ...

    # -- the primitives `rewind` is written over -----------------------------------------------------
    def undo_from(self, run_id: str, step: int) -> dict[str, Any]:
        """Each store key touched from `step` on -> what it held before the first of those steps touched it
        (an opaque value `cut` puts back; None: the key was absent)."""
        ...

    def cut(self, run_id: str, step: int, before: dict[str, Any]) -> None:
        """In one go: put back `before` (from `undo_from`), forget the trail, undo log and batches from
        `step` on, and set the run's step to `step`."""
        ...


def rewind(runs: RunStore, run_id: str, step: int) -> None:
    """Undo the steps from `step` on: the store as it was before that step, the trail cut there, and the
    batches from that step on forgotten, so they run again. The run is not running meanwhile (a resume
    rewinds before it goes on)."""
    if any(s.config is None for s in runs.steps(run_id)[step:]):
        raise Unrecoverable(
            f"run {run_id}: step {step} on cannot be rolled back (recorded by a chordflow without an undo log); "
            "run the workflow again"
        )
    runs.cut(run_id, step, runs.undo_from(run_id, step))


def prune(runs: RunStore, before: float) -> int:
    """Purge every ended run last updated before `before` (epoch seconds); returns how many. A run still queued or
    running is never touched, however old."""
    old = [r.run_id for r in runs.recent(limit=sys.maxsize) if r.status in FINAL and r.updated < before]
    for run_id in old:
        runs.purge(run_id)
    return len(old)
