"""Durable runs: `submit` records a run in Redis and enqueues its first advance; the workers take it from
there (worker/cluster/advance.py). `wait`, `status`, `cancel_run` and `resume_cluster` act on a run found
in whichever store recorded it (scheduler/lookup.py); a local run is followed through the embedded store.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ir.errors import BackendError, ValidationError, WaitTimeout
from scheduler import datasets
from scheduler.backends.celery import broker_errors
from scheduler.inputs import apply_inputs
from scheduler.inputs_file import read_encoded
from scheduler.lookup import cluster_runs, find_run
from worker import events, settings
from worker.batch.remote import rebuild
from worker.cluster import signing
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.batches.dispatch import send_advance
from worker.cluster.state.runstate import RunState
from worker.engine.flow import build_flow
from worker.engine.loader import load, source_of
from worker.engine.stepper import outputs as recorded_outputs
from worker.nodes.llm import usage_totals
from worker.runs.record import FINAL, RESULT_STATUS, RunRecord, RunResult, new_run_id, resumable
from worker.runs.resume_point import go_on_under
from worker.runs.store import RunStore, Unrecoverable

POLL_MS = 200
#: How often `wait` checks whether a dataset job ended with nobody left to say so (its reader died).
SETTLE_SECONDS = 2


def submit(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    inputs_file: str | Path | None = None,
    priority: str | None = None,
) -> str:
    """Validate, record the run in Redis, enqueue its first step; returns the run id at once.

    `priority` (high, normal, low; None: the workflow's `priority` field, else normal): where the run's chunks and
    advances go in the queue (worker/cluster/priorities.py).
    `inputs_file`: a JSON object of inputs, under `inputs` (which win where both name a key), read
    straight into the run's stored bytes: a large input is never built as objects in this process.
    """
    wf = load(workflow)
    from_file = read_encoded(inputs_file) if inputs_file is not None else {}
    store: dict[str, Any] = {}
    apply_inputs(wf, store, inputs, encoded=from_file)
    # A client without the key fails before it records anything; with it, the run's workflow is recorded signed.
    runs = cluster_runs(signing.publishing_signer(current_app()))
    run_id = run_id or new_run_id()
    record = RunRecord(run_id, wf.wire(), "celery", "queued", wf.start_id(), source=source_of(workflow))
    record.priority = priority or wf.priority or "normal"
    with broker_errors(settings.load().result_backend):
        try:
            runs.create(record, store, encoded={k: v for k, v in from_file.items() if k not in store})
        except BaseException as exc:  # part-way (Redis out of memory after the store): what it wrote goes
            with contextlib.suppress(Exception):
                status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
                runs.abandon(record, status, f"not recorded: {type(exc).__name__}: {exc}")  # type: ignore[attr-defined]
            raise
        try:
            send_advance("chordflow.advance", (run_id, 0))
        except Exception as exc:  # recorded but never enqueued: say so in the record, not "queued" forever
            with contextlib.suppress(Exception):
                runs.set_status(run_id, "failed", f"not enqueued: {exc}")
            raise
    return run_id


def workers_registered() -> int:
    """Worker processes in the registry now (0: a submitted run waits in the queue for one)."""
    return chunking.registered_processes(settings.load().result_backend)


def status(run_id: str) -> dict[str, Any]:
    """The `chordflow status --json` object; a dataset job's has `records` (total, done, failed, rate, eta_s), a
    run whose store keeps `__llm_calls__` has `llm` (calls, input_tokens, output_tokens)."""
    record, runs = find_run(run_id)
    info = record.status_dict()
    if record.dataset is not None:
        info["records"] = datasets.progress(record)
    else:
        with contextlib.suppress(Unrecoverable):  # a store that cannot be read back still has a status
            if (totals := usage_totals(runs.load_store(run_id))) is not None:
                info["llm"] = totals
    return info


def wait(
    run_id: str, timeout: float | None = None, *, on_event: Callable[[dict[str, Any]], None] | None = None
) -> RunResult:
    """Follow a cluster run until it ends; like `scheduler.run`, a node's exception is raised again here
    (its own type when importable, else RemoteError). Raises WaitTimeout when `timeout` passes first."""
    record, runs = find_run(run_id)
    deadline = None if timeout is None else time.monotonic() + timeout
    if not runs.durable:
        return _wait_local(record, runs, deadline, timeout)
    state = RunState(run_id)
    position, done, seen = "0-0", {}, {}
    branch_position = "0-0"
    settle_at = time.monotonic() + SETTLE_SECONDS
    while True:
        with broker_errors(settings.load().result_backend):
            record = runs.get(run_id)
            if record is None:
                raise BackendError(
                    f"run {run_id}: its state was lost from Redis (expired, flushed, or Redis restarted without "
                    "persistence)"
                )
            if record.status in FINAL:
                exception = runs.exception(run_id)
                result = None if exception else _result(record, runs)
        if record.status in FINAL:  # raised out here: a node's own OSError is no lost connection to Redis
            if result is None:
                raise rebuild(*exception)
            return result
        with broker_errors(settings.load().result_backend):
            if record.dataset is not None and time.monotonic() > settle_at:
                datasets.settle(record)
                settle_at = time.monotonic() + SETTLE_SECONDS
            position, entries = state.read_progress(position, POLL_MS)
            if on_event is not None:  # parallel branches' events, as they happen (worker/cluster/advance.py)
                branch_position, branch_events = state.read_branch_events(branch_position)
                for event in branch_events:
                    on_event(event)
            totals = {batch: state.batch_total(batch) for batch, packed in entries if packed and on_event}
        for batch, packed in entries:
            if packed is not None and on_event is not None:
                node, total = batch.split("#", 1)[0], totals[batch]
                flags = seen.setdefault(batch, bytearray(total))
                for index, ok in RunState.unpack_outcomes(packed):
                    if index < total and not flags[index]:  # a redelivered chunk repeats some items
                        flags[index] = 1
                        done[batch] = done.get(batch, 0) + 1
                        on_event(events.batch_progress(node, index, done[batch], total, bool(ok)))
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"run {run_id} is still {record.status} after {timeout:g}s (it goes on)")


def _wait_local(record: RunRecord, runs: RunStore, deadline: float | None, timeout: float | None) -> RunResult:
    """A local run ends in the process running it; another process follows its record in the embedded
    store (SQLite has no notifications: it reads the record every POLL_MS)."""
    while record.status not in FINAL:
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"run {record.run_id} is still {record.status} after {timeout:g}s (it goes on)")
        time.sleep(POLL_MS / 1000)
        record = runs.get(record.run_id) or record
    return _result(record, runs)


def _result(record: RunRecord, runs: RunStore) -> RunResult:
    if record.dataset is not None:
        return datasets.result_of(record)
    store = runs.load_store(record.run_id)
    status = RESULT_STATUS[record.status]
    if status == "cancelled":
        return RunResult(store, "cancelled", "run cancelled", {}, record.run_id, record.updated - record.created)
    exception = runs.exception(record.run_id)
    if status == "failed" and exception is not None:
        raise rebuild(*exception)
    outputs: dict[str, Any] = {}
    if status == "success":
        outputs = recorded_outputs(load(record.workflow), store)
    return RunResult(store, status, record.error, outputs, record.run_id, record.updated - record.created)


def cancel_run(run_id: str) -> int:
    """Set a run's cancel flag in Redis (chunks stop between items; no new step starts); returns how many
    queued chunks were revoked. A run driven by a client process (`scheduler.run(backend="celery")`) sees
    the flag and has its queued chunks revoked; a local run is stopped with Ctrl-C in its own process.

    A cluster run's chunks are never revoked: a revoked chord member fails the chord, so its body (which
    keeps the outcomes so far and records "cancelled") would never run and the run would stay "running".
    Its queued chunks see the flag as they start and return at once, without running an item.
    """
    record, runs = find_run(run_id)
    if record.backend != "celery":
        raise ValidationError(f"run {run_id} is a local run: stop it with Ctrl-C in the process running it")
    if record.status in FINAL:
        raise ValidationError(f"run {run_id} already ended: {record.status}")
    state = RunState(run_id)
    state.cancel()
    if record.dataset is not None:
        datasets.settle(record)
        return 0
    chunks = [] if runs.durable else state.chunk_ids()
    if chunks:
        current_app().control.revoke(chunks)
    state.describe(status="cancelled")
    if runs.durable and record.status == "queued":
        runs.set_status(run_id, "cancelled", "run cancelled")
    return len(chunks)


def resume_cluster(run_id: str, workflow: Any = None) -> None:
    """Let a failed or cancelled cluster run go on from its checkpoint: clear its stops, enqueue an advance.

    `workflow`: an edited workflow (any finished run, a succeeded one too): it goes into the run record,
    the run is rewound to its first changed node (worker/runs/resume_point.py), then the advance is enqueued."""
    record, runs = find_run(run_id, signing.publishing_signer(current_app()))  # an edited workflow goes in signed
    if record.status not in resumable(workflow):
        raise ValidationError(f"run {run_id} is {record.status}; only a failed or cancelled run can be resumed")
    step = record.step
    if workflow is not None:
        step = go_on_under(runs, record, build_flow(load(workflow)), source_of(workflow)).step
    state = RunState(run_id)
    state.clear_stops()
    runs.set_status(run_id, "queued", None)
    send_advance("chordflow.advance", (run_id, step))
