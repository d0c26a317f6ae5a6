"""How the repair flow runs a proposed workflow: the failed run resumed under it, from its checkpoint
(completed nodes the proposal leaves unchanged are not run again), or — a run that never started (it did
not validate) — a new run; on the backend the failed run used, local or cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ir.errors import RunCancelled
from scheduler import api, lookup
from scheduler.repair.failure import ERROR_ACTION, Failure
from worker.runs.record import RunResult, new_run_id


@dataclass
class Attempt:
    """One run of a proposal: its result when it succeeded, else its failure; the nodes it took from the
    checkpoint."""

    result: RunResult | None
    failure: Failure | None
    cached: list[str] = field(default_factory=list)


@dataclass
class Runner:
    backend: str = "local"
    inputs: dict[str, Any] | None = None  # for a run that never started
    run_id: str | None = None  # the id such a run gets (default: a new one)
    hooks: dict[str, Any] = field(default_factory=dict)  # on_event, on_node_start, cancelled (a display)

    def find(self, run_id: str) -> tuple[Any, Any] | None:
        """(record, RunStore) of a recorded run, or None (a local runner never asks the cluster)."""
        if self.backend == "local":
            runs = lookup.local_runs()
            record = runs.get(run_id)
            return (record, runs) if record is not None else None
        try:
            return lookup.find_run(run_id)
        except Exception:
            return None

    def store(self, run_id: str | None) -> dict[str, Any] | None:
        """The run's store at its checkpoint (what the failed node saw), or the inputs of a run never started."""
        found = self.find(run_id) if run_id else None
        if found is None:
            return dict(self.inputs or {})
        return found[1].load_store(run_id)

    def run(self, workflow: dict[str, Any], failure: Failure) -> Attempt:
        run_id = failure.run_id
        cached: list[str] = []
        try:
            if run_id is None:
                run_id = self.run_id or new_run_id()
                result = self._start(workflow, run_id)
            else:
                record, runs = self.find(run_id) or (None, None)
                if record is None:
                    raise RunCancelled(f"run {run_id}: its record is gone; it cannot be resumed")
                cached = api.plan_resume(run_id, workflow).kept
                result = self._resume(run_id, workflow, not runs.durable)
        except (KeyboardInterrupt, RunCancelled):
            raise
        except Exception as exc:
            found = self.find(run_id)
            recorded, node = (run_id, found[0].node) if found else (None, None)
            return Attempt(None, Failure.from_exception(exc, recorded, node), cached)
        if result.status == "cancelled":
            raise RunCancelled(result.error or "run cancelled")
        if result.status != "success":
            found = self.find(result.run_id)
            node = found[0].node if found else None
            failure = Failure(result.error or "failed", ERROR_ACTION, node, result.run_id, result=result)
            return Attempt(None, failure, cached)
        return Attempt(result, None, cached)

    def _start(self, workflow: dict[str, Any], run_id: str) -> RunResult:
        if self.backend == "local":
            return api.run(workflow, self.inputs, run_id=run_id, **self.hooks)
        api.submit(workflow, self.inputs, run_id=run_id)
        return api.wait(run_id, on_event=self.hooks.get("on_event"))

    def _resume(self, run_id: str, workflow: dict[str, Any], local: bool) -> RunResult:
        if local:
            return api.resume(run_id, workflow=workflow, **self.hooks)
        api.resume_cluster(run_id, workflow=workflow)
        return api.wait(run_id, on_event=self.hooks.get("on_event"))
