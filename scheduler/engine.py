"""`run` and `stream`: execute a workflow on a backend and report what happened."""

from __future__ import annotations

import queue
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ir.errors import RunCancelled
from ir.templates import resolve_template
from scheduler import backends
from scheduler.compiler import compile, load
from scheduler.inputs import apply_inputs
from worker import context
from worker.context import RunContext


@dataclass
class RunResult:
    shared: dict[str, Any]
    status: str  # "success" | "failed" | "cancelled"
    error: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    duration_s: float = 0.0


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
    """Run a workflow to completion. `shared`, when given, is mutated in place.

    A fail_fast batch failure (or any node exception without an `error` edge) propagates as the
    original exception; an unhandled `error` action ends the run with status "failed".
    """
    started = time.perf_counter()
    wf = load(workflow)
    store = shared if shared is not None else {}
    apply_inputs(wf, store, inputs)
    flow = compile(wf)
    run_id = run_id or uuid.uuid4().hex[:12]
    cancelled = cancelled or threading.Event()
    ctx = RunContext(sink=on_event, cancelled=cancelled, on_node_start=on_node_start)
    if options:
        warnings.warn(f"scheduler.run: ignoring unknown options {sorted(options)}", stacklevel=2)
    ctx.backend = backends.create(backend, run_id, ctx)
    last_action = None
    with context.using(ctx):
        try:
            last_action = flow._run(store)
        except RunCancelled:
            cancelled.set()
    status, error = "success", None
    if cancelled.is_set():
        status, error = "cancelled", "run cancelled"
    elif last_action == "error":
        status = "failed"
        namespace = store.get(ctx.last_node) if ctx.last_node else None
        detail = namespace.get("error") or namespace.get("stderr") if isinstance(namespace, dict) else None
        error = f"node '{ctx.last_node}' returned 'error'" + (f": {detail}" if detail else "")
    outputs = {}
    if status == "success":  # a failed or cancelled run may not have produced what outputs refer to
        outputs = {name: resolve_template(o.source, store, f"outputs.{name}") for name, o in (wf.outputs or {}).items()}
    return RunResult(store, status, error, outputs, run_id, time.perf_counter() - started)


def stream(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    shared: dict[str, Any] | None = None,
    backend: str = "local",
    **options: Any,
) -> Iterator[dict[str, Any]]:
    """Yield events while the workflow runs (DESIGN section 6); the last is `final`.

    A failure is reported as an `error` event followed by a `final` event with status "failed";
    closing the generator early cancels the run.
    """
    events: queue.Queue[dict[str, Any] | None] = queue.Queue()
    cancelled = threading.Event()
    store = shared if shared is not None else {}
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = run(
                workflow, inputs, shared=store, backend=backend, on_event=events.put, cancelled=cancelled, **options
            )
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            events.put(None)

    thread = threading.Thread(target=target, name="chordflow-stream", daemon=True)
    thread.start()
    try:
        while (event := events.get()) is not None:
            yield event
    finally:
        cancelled.set()
        thread.join()
    if "error" in outcome:
        exc = outcome["error"]
        yield {"type": "error", "node": None, "error": f"{type(exc).__name__}: {exc}"}
        yield {"type": "final", "state": store, "status": "failed", "error": str(exc)}
        return
    result: RunResult = outcome["result"]
    yield {"type": "final", "state": result.shared, "status": result.status, "error": result.error}
