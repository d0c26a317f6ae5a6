"""`run`, `resume` and `stream`: drive a workflow on a backend, checkpointing every step, and report.

Every run is recorded in the embedded store (worker/runs/sqlite.py) with a checkpoint after each node,
so a failed or cancelled run can go on from where it stopped under the same id (`resume`).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ir.errors import RunCancelled, ValidationError
from scheduler import backends
from scheduler.compiler import compile, load
from scheduler.inputs import apply_inputs
from worker import events, redact
from worker.engine import context
from worker.engine.context import RunContext
from worker.engine.flow import WorkflowFlow
from worker.engine.sections import StoredBranches, ThreadedSections
from worker.engine.stepper import Cursor, batch_nodes, drive, ending
from worker.runs.record import RECORD_STATUS, RunRecord, StepJournal
from worker.runs.resume_point import go_on_under, resume_point
from worker.runs.sqlite import LocalRuns


@dataclass
class RunResult:
    shared: dict[str, Any]
    status: str  # "success" | "failed" | "cancelled"
    error: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    duration_s: float = 0.0


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


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
    items: Any = None,
    **options: Any,
) -> RunResult:
    """Run a workflow to completion. `shared`, when given, is mutated in place.

    A fail_fast batch failure (or any node exception without an `error` edge) propagates as the
    original exception; an unhandled `error` action ends the run with status "failed".
    `items`: a dataset job, the workflow once per record (scheduler/datasets.py; `as_`, `format`... in
    `options`); its RunResult's outputs are the record counts, `results` streams the rest.
    """
    if items is not None:
        from scheduler import datasets, durable  # both import this module

        opts = datasets.options(options)
        if backend == "local":
            return datasets.run_local(
                workflow, inputs, items, run_id=run_id, on_event=on_event, cancelled=cancelled, **opts
            )
        return durable.wait(durable.submit(workflow, inputs, items=items, run_id=run_id, **options), on_event=on_event)
    started = time.perf_counter()
    wf = load(workflow)
    store = shared if shared is not None else {}
    apply_inputs(wf, store, inputs)
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
        raise ValidationError(f"run {run_id}: unknown run (not in {runs.path})")
    if record.status not in resumable(workflow):
        raise ValidationError(f"run {run_id} is {record.status}; only a failed or cancelled run can be resumed")
    if workflow is None:
        flow = compile(load(record.workflow))
        cursor = Cursor(record.node, record.step)
    else:
        flow = compile(load(workflow))
        point = go_on_under(runs, record, flow, source_of(workflow))
        cursor = Cursor(point.node, point.step)
    store = runs.load_store(run_id)
    runs.set_status(run_id, "running")
    return _go_on(flow, record, cursor, store, runs, on_event, cancelled, on_node_start, started)


def resumable(workflow: Any = None) -> tuple[str, ...]:
    """The statuses a run can be resumed from (with an edited workflow, a succeeded run too)."""
    return ("failed", "cancelled") if workflow is None else ("failed", "cancelled", "succeeded")


def cached_nodes(run_id: str, workflow: Any = None) -> list[str]:
    """The nodes a resumed run will not execute again (completed before it stopped), in order; with an
    edited `workflow`, those it leaves unchanged (before the first changed one)."""
    runs = LocalRuns.default()
    if workflow is None:
        return runs.trail(run_id)
    record = runs.get(run_id)
    if record is None:
        raise ValidationError(f"run {run_id}: unknown run (not in {runs.path})")
    return resume_point(runs.steps(run_id), record, compile(load(workflow))).kept


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
    ctx = RunContext(sink=on_event, cancelled=cancelled, on_node_start=on_node_start)
    try:
        ctx.backend = backends.create(record.backend, run_id, ctx)  # may fail at once: Redis unreachable
        ctx.sections = ThreadedSections(
            StoredBranches(runs, run_id), lambda c: backends.create(record.backend, run_id, c)
        )
        with context.using(ctx):
            cursor = drive(flow, cursor, store, ctx, StepJournal(runs, run_id, batch_nodes(flow)))
    except RunCancelled:
        cancelled.set()
    except KeyboardInterrupt:
        runs.set_status(run_id, "cancelled", "run cancelled", ctx.last_node)
        raise
    except BaseException as exc:
        runs.set_status(run_id, "failed", redact.mask(f"{type(exc).__name__}: {exc}"), ctx.last_node)
        raise
    status, error, outputs = "cancelled", "run cancelled", {}
    if not cancelled.is_set():
        status, error, outputs = ending(flow, cursor, store, ctx.last_node)
    runs.set_status(run_id, RECORD_STATUS[status], error, ctx.last_node if status != "success" else None)
    return RunResult(store, status, error, outputs, run_id, time.perf_counter() - started)


def source_of(workflow: Any) -> str | None:
    """The workflow file a run came from (kept in its record), when it was given as a path."""
    if isinstance(workflow, Path) or (isinstance(workflow, str) and not workflow.lstrip().startswith(("{", "["))):
        return str(workflow)
    return None


#: Events a stream holds for a consumer that has not read them yet; beyond, the run waits for it.
STREAM_BUFFER = 1000


def stream(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    shared: dict[str, Any] | None = None,
    backend: str = "local",
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """Yield events while the workflow runs (DESIGN section 6); the last is `final`.

    A node failure is ONE `error` event naming the node, then a `final` event with status "failed";
    `final` carries `status`, `error`, `outputs` and `run_id` like RunResult. Closing the generator
    early cancels the run.
    """
    queue_: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=STREAM_BUFFER)
    cancelled = threading.Event()

    def put(event: dict[str, Any] | None) -> None:
        """Wait for room (a slow consumer slows the run down), unless the consumer has left."""
        while not cancelled.is_set():
            try:
                queue_.put(event, timeout=0.1)
                return
            except queue.Full:
                continue

    store = shared if shared is not None else {}
    run_id = options.pop("run_id", None) or new_run_id()
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run(
                workflow, inputs, shared=store, backend=backend, on_event=put, cancelled=cancelled,
                run_id=run_id, **options,
            )  # fmt: skip
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            put(None)

    thread = threading.Thread(target=target, name="chordflow-stream", daemon=True)
    thread.start()
    reported_error = False
    try:
        while (event := queue_.get()) is not None:
            reported_error = reported_error or event.get("type") == "error"
            yield event
    finally:
        cancelled.set()
        thread.join()
    if "error" in outcome:
        exc = outcome["error"]
        if not reported_error:  # raised outside any node (bad input, a lost backend): still one error event
            yield events.error(None, redact.mask(f"{type(exc).__name__}: {exc}"))
        final = {
            "status": "failed",
            "error": redact.mask(f"{type(exc).__name__}: {exc}"),
            "outputs": {},
            "run_id": run_id,
        }
        yield {"type": "final", "state": store, **final}
        return
    result: RunResult = outcome["result"]
    yield {"type": "final", "state": result.shared, "status": result.status, "error": result.error,
           "outputs": result.outputs, "run_id": result.run_id}  # fmt: skip
