"""The public entry points: `run`, `stream`, `submit`, `wait`, `status`, `resume`, `redrive`, `update`, `cancel`,
`signal`, `purge`, `prune`, and schedules: `schedule`, `list_schedules`, `unschedule`, `pause_schedule`,
`resume_schedule`.

The ONE place that routes a call: to a dataset job (`items=`) or a workflow, to a run this process drives
(scheduler/driver.py) or one the cluster's workers drive (scheduler/durable.py), and to the store that
holds a run (scheduler/lookup.py). The cluster half is imported only when a call needs it, so a local
workflow run never loads Celery or Redis (a dataset job does: scheduler/datasets/ serves both stores).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ir.errors import BackendError, ValidationError
from ir.loader import given_inputs
from scheduler import driver, lookup
from scheduler.cwd import use_cwd_modules
from scheduler.records import Items
from worker import events, redact
from worker.engine.flow import build_flow
from worker.engine.loader import load
from worker.engine.stepper import outputs as recorded_outputs
from worker.runs.record import FINAL, RunRecord, RunResult, new_run_id
from worker.runs.redrive import BatchRedrive, plan_batch_redrive
from worker.runs.resume_point import items_from_checkpoint, resume_point
from worker.runs.store import RunStore
from worker.runs.store import prune as prune_runs


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
    items: Items | None = None,
    **options: Any,
) -> RunResult:
    """Run a workflow to completion. `shared`, when given, is mutated in place.

    A fail_fast batch failure (or any node exception without an `error` edge) propagates as the
    original exception; an unhandled `error` action ends the run with status "failed".
    `items`: a dataset job, the workflow once per record (scheduler/datasets/; `as_`, `format`... in
    `options`); its RunResult's outputs are the record counts, `results` streams the rest.
    """
    use_cwd_modules()  # `examples.*` and `python` functions of the working directory, as the CLI imports them
    if items is None:
        return driver.run(
            workflow, inputs, shared=shared, backend=backend, on_event=on_event, run_id=run_id,
            cancelled=cancelled, on_node_start=on_node_start, **options,
        )  # fmt: skip
    from scheduler.datasets import running

    opts = running.options(options)
    if backend == "local":
        return running.run_local(workflow, inputs, items, run_id=run_id, on_event=on_event, cancelled=cancelled, **opts)
    return wait(running.submit(workflow, inputs, items, run_id=run_id, **opts), on_event=on_event)


def submit(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    inputs_file: str | Path | None = None,
    items: Items | None = None,
    idempotency_key: str | None = None,
    on_repeat: Callable[[str], None] | None = None,
    priority: str | None = None,
    **dataset_options: Any,
) -> str:
    """Validate, record the run in Redis, enqueue its first step; returns the run id at once.

    `idempotency_key`: the same key again within CHORDFLOW_RUN_TTL returns the first submit's run id and records
    nothing (`on_repeat(run_id)` is called then); another workflow or other inputs under it raise
    IdempotencyConflict naming that run. Not with `items` (a dataset job): ValidationError.

    `inputs_file`: a JSON object of inputs, under `inputs` (which win where both name a key), read
    straight into the run's stored bytes: a large input is never built as objects in this process.
    `items`: a dataset job, the workflow once per record of this file (or iterable): scheduler/datasets/,
    with its options (`as_`, `format`, `skip_bad_records`, `tolerated_failure_percent`,
    `tolerated_failure_count`, `chunk_size`, `max_record_bytes`); returns once every record is stored in Redis.
    `priority`: high, normal or low (None: the workflow's `priority` field, else normal): a higher run's chunks and
    advances go before lower ones already queued.
    """
    use_cwd_modules()
    if items is not None:
        from scheduler.datasets import running

        if idempotency_key is not None:
            raise ValidationError("idempotency_key: a dataset job (items) takes none; only a workflow submit does")
        return running.submit(
            workflow, inputs, items, run_id=run_id, priority=priority, **running.options(dataset_options)
        )
    from scheduler import durable

    return durable.submit(
        workflow, inputs, run_id=run_id, inputs_file=inputs_file, idempotency_key=idempotency_key,
        on_repeat=on_repeat, priority=priority,
    )  # fmt: skip


def wait(
    run_id: str, timeout: float | None = None, *, on_event: Callable[[dict[str, Any]], None] | None = None
) -> RunResult:
    """Follow a run until it ends (see scheduler/waiting.py `wait`)."""
    from scheduler import waiting

    return waiting.wait(run_id, timeout, on_event=on_event)


def status(run_id: str) -> dict[str, Any]:
    """The `chordflow status --json` object of a run in either store."""
    from scheduler import waiting

    return waiting.status(run_id)


def resume(
    run_id: str,
    *,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancelled: threading.Event | None = None,
    on_node_start: Callable[[str], None] | None = None,
    workflow: Any = None,
) -> RunResult:
    """Go on with a failed or cancelled local run from its last checkpoint (scheduler/driver.py `resume`);
    a cluster run goes on with `resume_cluster`."""
    return driver.resume(run_id, on_event=on_event, cancelled=cancelled, on_node_start=on_node_start, workflow=workflow)


@dataclass
class ResumePlan:
    """Where a run would go on (`resume`, `resume --workflow`), before anything moves: the nodes kept from
    its checkpoint (`↻ cached`), the node and step it goes on from, why it goes back (an edited workflow's
    first changed node, else None) and the store that holds it."""

    record: RunRecord
    runs: RunStore
    kept: list[str]
    node: str | None
    step: int
    reason: str | None = None

    @property
    def cached_items(self) -> int:
        """Items of the batch node the run stopped in whose outcomes the resume keeps."""
        if self.reason is not None:
            return 0
        return items_from_checkpoint(self.runs, self.record.run_id, self.node, self.step)


def plan_resume(run_id: str, workflow: Any = None) -> ResumePlan:
    """Where the run `run_id` goes on, as it stands (with an edited `workflow`: under it)."""
    record, runs = lookup.find_run(run_id)
    if workflow is None:
        return ResumePlan(record, runs, runs.trail(run_id), record.node, record.step)
    point = resume_point(runs.steps(run_id), record, build_flow(load(workflow, given_inputs(record.workflow))))
    return ResumePlan(record, runs, point.kept, point.node, point.step, point.reason)


def cached_nodes(run_id: str, workflow: Any = None) -> list[str]:
    """The nodes a resumed run will not execute again (completed before it stopped), in order; with an
    edited `workflow`, those it leaves unchanged (before the first changed one)."""
    return plan_resume(run_id, workflow).kept


def outputs(run_id: str) -> dict[str, Any]:
    """A succeeded run's declared outputs, resolved again on its final store."""
    record, runs = lookup.find_run(run_id)
    return recorded_outputs(load(record.workflow), runs.load_store(run_id))


def resume_cluster(run_id: str, workflow: Any = None) -> None:
    """Let a failed or cancelled cluster run go on from its checkpoint (its workers take it from there)."""
    from scheduler import durable

    durable.resume_cluster(run_id, workflow)


def redrive(run_id: str, node: str | None = None, **hooks: Any) -> RunResult | int:
    """Run a finished dataset job's failed (and never run) records again (scheduler/datasets/), or with `node`,
    a finished run's batch node's failed items, then the nodes after it (worker/runs/redrive.py).

    A local run goes on here (returns its RunResult); a cluster run is handed to the workers (returns how many
    records or items will run again)."""
    if node is None:
        from scheduler.datasets import running

        return running.redrive(run_id, **hooks)
    _, runs = lookup.find_run(run_id)
    if not runs.durable:
        return driver.redrive(run_id, node, **hooks)
    from scheduler import durable

    return durable.redrive_cluster(run_id, node)


def plan_redrive(run_id: str, node: str) -> BatchRedrive:
    """What `redrive(run_id, node=node)` would keep and run again, before anything moves (its refusals too)."""
    record, runs = lookup.find_run(run_id)
    return plan_batch_redrive(runs, record, node)


def update(
    run_id: str,
    *,
    max_concurrent: int | None = None,
    tolerated_failure_percent: float | None = None,
    tolerated_failure_count: int | None = None,
    priority: str | None = None,
    budget_tokens: int | None = None,
    budget_usd: float | None = None,
) -> dict[str, Any]:
    """Change a running cluster run's limits (`chordflow update`): its batches' `max_concurrent` (permits follow
    within about a second), their failure thresholds (each chunk and the batch's verdict read them), its
    priority and its budget (also on a run that ended: a run over budget fails, and `resume` goes on); returns the
    changes, which the run record keeps with their time (`status`: `updates`)."""
    from scheduler import durable

    changes = {
        "max_concurrent": max_concurrent, "tolerated_failure_percent": tolerated_failure_percent,
        "tolerated_failure_count": tolerated_failure_count, "priority": priority, "budget_tokens": budget_tokens,
        "budget_usd": budget_usd,
    }  # fmt: skip
    return durable.update_run(run_id, changes)


def cancel(run_id: str) -> int:
    """Stop a cluster run (or a client-driven one); returns how many queued chunks were revoked."""
    from scheduler import durable

    return durable.cancel_run(run_id)


def signal(run_id: str, event: str, data: Any = None) -> None:
    """Send `event` to a run, with `data` (any JSON value): its `wait` node waiting for the event goes on, with
    `data` in its namespace. Sent before the run waits for it, the event is kept until a wait for it takes it."""
    if not isinstance(event, str) or not event:
        raise ValidationError(f"signal: the event must be a non-empty string, got {event!r}")
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"signal {event!r}: data must be a JSON value ({exc})") from None
    record, runs = lookup.find_run(run_id)
    if record.status in FINAL:
        raise ValidationError(f"run {record.run_id} already ended ({record.status}): nothing waits for '{event}'")
    runs.signal(record.run_id, event, data)


def purge(run_id: str) -> None:
    """Delete everything of an ended run from the store that holds it, its record too (`chordflow purge`); a
    client-driven run (`run(backend="celery")`, recorded in the embedded store) also from Redis, where its batches'
    windows, progress and kept chunks are. A run still queued or running is refused: its workers or process would
    write it back."""
    record, runs = lookup.find_run(run_id)
    if record.status not in FINAL:
        raise ValidationError(f"run {run_id} is {record.status}: stop it first with `chordflow cancel {run_id}`")
    runs.purge(run_id)
    if not runs.durable and record.backend != "local":  # a client-driven run: its batches' keys are in Redis too
        lookup.cluster_runs().purge(record.run_id)


def prune(older_than: float) -> dict[str, int | None]:
    """Purge the ended runs of both stores last updated more than `older_than` seconds ago; returns how many per
    store (`where` -> count; None: the cluster's Redis did not answer, so nothing was pruned there)."""
    before = time.time() - older_than
    local = lookup.local_runs()
    pruned: dict[str, int | None] = {local.where: prune_runs(local, before)}
    try:
        cluster = lookup.cluster_runs()
    except BackendError:
        pruned["Redis"] = None
    else:
        pruned[cluster.where] = prune_runs(cluster, before)
    return pruned


def schedule(
    name: str,
    workflow: Any,
    cron: str,
    *,
    timezone: str = "UTC",
    inputs: dict[str, Any] | None = None,
    catchup: str = "last",
    priority: str | None = None,
) -> dict[str, Any]:
    """Run `workflow` on the cluster at every time `cron` names in `timezone`, made by the workers (no other process);
    a schedule of the same name is replaced. Returns it as `list_schedules` shows it, plus `replaced`.
    `catchup`: the fires missed while no worker ran: `none`, the latest (`last`) or each (`all`). See
    scheduler/schedules.py `add`."""
    use_cwd_modules()
    from scheduler import schedules

    return schedules.add(
        name, workflow, cron, timezone=timezone, inputs=inputs, catchup=catchup, priority=priority
    )  # fmt: skip


def list_schedules() -> list[dict[str, Any]]:
    """Every schedule: cron, timezone, catchup, paused, its next fire, its last fire and run."""
    from scheduler import schedules

    return schedules.list_schedules()


def unschedule(name: str) -> None:
    """Remove a schedule (UnknownSchedule if there is none); the runs it made are left as they are."""
    from scheduler import schedules

    schedules.remove(name)


def pause_schedule(name: str) -> dict[str, Any]:
    """A schedule makes no run until resumed: the fires meanwhile are skipped."""
    from scheduler import schedules

    return schedules.pause(name)


def resume_schedule(name: str) -> dict[str, Any]:
    """A paused schedule fires again, from the first time after now."""
    from scheduler import schedules

    return schedules.resume(name)


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
    """Yield events while the workflow runs (docs/ARCHITECTURE.md, events); the last is `final`.

    A node failure is ONE `error` event naming the node, then a `final` event with status "failed";
    `final` carries `status`, `error`, `outputs` and `run_id` like RunResult. Closing the generator
    early cancels the run.
    """
    use_cwd_modules()
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
