"""Runs this process drives: `run` and `resume` a workflow on a batch backend, checkpointing every step.

Every such run is recorded in the embedded store (worker/runs/sqlite.py) with a checkpoint after each node,
so a failed or cancelled run can go on from where it stopped under the same id (`resume`). The public
entry points (which also route dataset jobs and cluster runs) are in scheduler/api.py.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from ir.errors import Fenced, RunCancelled, UnknownRun, ValidationError
from ir.loader import given_inputs
from scheduler import backends
from scheduler.compiler import compile
from scheduler.inputs import apply_inputs
from worker import redact, tracing
from worker.engine import context
from worker.engine.context import RunContext
from worker.engine.flow import WorkflowFlow
from worker.engine.loader import load, source_of
from worker.engine.sections import StoredBranches
from worker.engine.stepper import ThreadedSections, batch_nodes, drive, ending
from worker.engine.steps import Cursor
from worker.llm import usage
from worker.llm.budget import local_budget
from worker.llm.usage import usage_totals
from worker.runs.record import RECORD_STATUS, RunRecord, RunResult, StepJournal, new_run_id, resume_refusal
from worker.runs.redrive import redrive_batch
from worker.runs.resume_point import go_on_under
from worker.runs.sqlite import LocalRuns


def run(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    shared: dict[str, Any] | None = None,
    backend: str = "local",
    on_event: Callable[[dict[str, Any]], None] | None = None,
    run_id: str | None = None,
    cancelled: threading.Event | None = None,
    on_node_start: Callable[[str], None] | None = None,
    **options: Any,
) -> RunResult:
    """Run a workflow to completion in this process. `shared`, when given, is mutated in place.

    A fail_fast batch failure (or any node exception without an `error` edge) propagates as the
    original exception; an unhandled `error` action ends the run with status "failed".
    """
    started = time.perf_counter()
    store = shared if shared is not None else {}
    wf = load(workflow, [*(inputs or {}), *store])  # what the run is given is a known input
    apply_inputs(wf, store, inputs)
    usage.start_list(wf, store)
    flow = compile(wf)
    if options:
        warnings.warn(f"scheduler.run: ignoring unknown options {sorted(options)}", stacklevel=2)
    record = RunRecord(run_id or new_run_id(), wf.wire(), backend, "running", flow.start_id, source=source_of(workflow))
    runs = LocalRuns.default()
    runs.create(record, store)
    return _go_on(flow, record, Cursor(flow.start_id), store, runs, on_event, cancelled, on_node_start, started)


def resume(
    run_id: str,
    *,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancelled: threading.Event | None = None,
    on_node_start: Callable[[str], None] | None = None,
    workflow: Any = None,
) -> RunResult:
    """Go on with a failed or cancelled run from its last checkpoint, under the same id: completed nodes
    are not run again, and a batch cut short runs only the items that have no outcome yet.

    `workflow`: an edited workflow to go on with (any finished run, a succeeded one too): the completed
    nodes it leaves unchanged are kept, the first changed one and everything after it run again
    (worker/runs/resume_point.py)."""
    started = time.perf_counter()
    runs = LocalRuns.default()
    record = runs.get(run_id)
    if record is None:
        raise UnknownRun(f"unknown run '{run_id}' (not in {runs.where})", run_id)
    if refusal := resume_refusal(record, workflow):
        raise ValidationError(refusal)
    if workflow is None:
        flow = compile(load(record.workflow))
        cursor = Cursor(record.node, record.step)
    else:
        flow = compile(load(workflow, given_inputs(record.workflow)))
        point = go_on_under(runs, record, flow, source_of(workflow))
        cursor = Cursor(point.node, point.step)
    store = runs.load_store(run_id)
    runs.set_status(run_id, "running")
    return _go_on(flow, record, cursor, store, runs, on_event, cancelled, on_node_start, started)


def redrive(
    run_id: str,
    node: str,
    *,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancelled: threading.Event | None = None,
    on_node_start: Callable[[str], None] | None = None,
) -> RunResult:
    """Run a finished run's batch node `node` again for its failed items only, then the nodes after it, under the
    same id (worker/runs/redrive.py)."""
    started = time.perf_counter()
    runs = LocalRuns.default()
    record = runs.get(run_id)
    if record is None:
        raise UnknownRun(f"unknown run '{run_id}' (not in {runs.where})", run_id)
    plan = redrive_batch(runs, record, node)
    flow = compile(load(record.workflow))
    store = runs.load_store(run_id)
    runs.set_status(run_id, "running")
    return _go_on(flow, record, Cursor(node, plan.step), store, runs, on_event, cancelled, on_node_start, started)


def _go_on(
    flow: WorkflowFlow,
    record: RunRecord,
    cursor: Cursor,
    store: dict[str, Any],
    runs: LocalRuns,
    on_event: Callable[[dict[str, Any]], None] | None,
    cancelled: threading.Event | None,
    on_node_start: Callable[[str], None] | None,
    started: float,
) -> RunResult:
    run_id = record.run_id
    cancelled = cancelled or threading.Event()
    ctx = RunContext(sink=on_event, cancelled=cancelled, on_node_start=on_node_start, answers=runs.answers(run_id))
    ctx.waits = runs.waits(run_id)
    ctx.budget = local_budget(flow.workflow, usage_totals(store))  # a resumed run counts what it billed before
    try:
        ctx.backend = backends.create(record.backend, run_id, ctx)  # may fail at once: Redis unreachable
        ctx.sections = ThreadedSections(
            StoredBranches(runs, run_id), lambda c: backends.create(record.backend, run_id, c)
        )
        with (
            context.using(ctx),
            tracing.within(run_id),
            tracing.span("chordflow run", {"chordflow.backend": record.backend}),
        ):
            cursor = drive(flow, cursor, store, ctx, StepJournal(runs, run_id, batch_nodes(flow)))
        status, error, outputs = "cancelled", "run cancelled", {}
        if not cancelled.is_set():  # resolving the outputs may fail too: the run is then failed, not running
            status, error, outputs = ending(flow, cursor, store, ctx.last_node)
    except RunCancelled:
        status, error, outputs = "cancelled", "run cancelled", {}
        cancelled.set()
    except Fenced:  # another process took the run over from its checkpoint: its record is theirs now
        raise
    except KeyboardInterrupt:
        runs.set_status(run_id, "cancelled", "run cancelled", ctx.last_node)
        raise
    except BaseException as exc:
        runs.set_status(run_id, "failed", redact.mask(f"{type(exc).__name__}: {exc}"), ctx.last_node)
        raise
    runs.set_status(run_id, RECORD_STATUS[status], error, ctx.last_node if status != "success" else None)
    return RunResult(store, status, error, outputs, run_id, time.perf_counter() - started)
