"""Redrive of one batch node of a finished run (`chordflow redrive RUN --node N`): its failed items run again,
under the same run id, and the run goes on from there.

The run is rewound to the step where the node last ran (its store as it was before that step, the steps after
it forgotten) and the node's succeeded items are kept as the batch's saved outcomes, the ones a batch cut short
keeps: going on from that step, the batch runs only the items without an outcome (the failed ones, and any that
never ran), merges them with the kept ones in input order, and every node after it runs again. Both stores
keep a batch with a failed item chunk by chunk (`batch_rows`), so the outcomes come from there.

The accumulator entries (`__llm_calls__`...) of the kept items are not added again: the rewind puts those lists
back as they were before the batch, and the outcomes keep no per-item entries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ir.errors import ValidationError
from worker.batch.aggregate import ChunkResult
from worker.engine.loader import load
from worker.runs.record import FINAL, RunRecord
from worker.runs.store import RunStore, rewind


@dataclass
class BatchRedrive:
    """Where a redriven run goes on: the batch node, its step, the nodes before it (kept), its succeeded items
    (kept, as contiguous chunks) and how many of its items failed."""

    node: str
    step: int
    kept: list[str]
    failed: int
    chunks: list[ChunkResult] = field(default_factory=list)

    @property
    def cached_items(self) -> int:
        return sum(len(c.results) for c in self.chunks)


def plan_batch_redrive(runs: RunStore, record: RunRecord, node: str) -> BatchRedrive:
    """What redriving `node` of run `record` would do, before anything moves; ValidationError (one line) when the
    run is not finished, is a dataset job, or `node` is not a batch node of it that ran with failed items."""
    run_id = record.run_id
    if record.status not in FINAL:
        raise ValidationError(f"run {run_id} is {record.status}; only a finished run can be redriven")
    if record.dataset is not None:
        raise ValidationError(f"run {run_id} is a dataset job: `chordflow redrive {run_id}` (no --node) redrives it")
    if not runs.durable and record.backend != "local":  # that process merges only the chunks it ran
        raise ValidationError(
            f"run {run_id} sent its batches to the cluster from the process that ran it (scheduler.run with "
            "backend='celery'): only a local or a submitted run's batch node can be redriven"
        )
    spec = next((n for n in load(record.workflow).nodes if n.id == node), None)
    if spec is None or spec.batch is None:
        what = "has no node" if spec is None else "has no batch node"
        raise ValidationError(f"run {run_id} {what} '{node}': --node names a batch node of the run")
    trail = runs.trail(run_id)
    if node in trail:
        step = len(trail) - 1 - trail[::-1].index(node)  # the last time it ran
    elif record.node == node:  # the run stopped in it (fail_fast, a failure threshold, a cancel)
        step = record.step
    else:
        raise ValidationError(f"run {run_id}: batch node '{node}' never ran, so it has no failed items")
    plan = BatchRedrive(node, step, trail[:step], 0)
    try:
        rows = runs.batch_rows(run_id, node)
    except LookupError:
        rows = iter(())
    current: ChunkResult | None = None
    for row in rows:
        if row["error"] is not None:
            plan.failed, current = plan.failed + 1, None
        elif current is not None and current.start + len(current.results) == row["index"]:
            current.results.append(row["result"])
        else:
            current = ChunkResult(row["index"], [row["result"]], [], {})
            plan.chunks.append(current)
    if not plan.failed:
        raise ValidationError(f"run {run_id}: batch node '{node}' has no failed items to redrive")
    return plan


def redrive_batch(runs: RunStore, record: RunRecord, node: str) -> BatchRedrive:
    """Rewind run `record` to the step of batch node `node`, its succeeded items kept, the run pointed at it;
    the caller then lets it go on from `plan.step` (in this process, or by enqueueing an advance)."""
    plan = plan_batch_redrive(runs, record, node)
    rewind(runs, record.run_id, plan.step)
    runs.save_chunks(record.run_id, f"{node}#{plan.step}", plan.chunks)
    runs.set_workflow(record.run_id, record.workflow, None, node)
    return plan
