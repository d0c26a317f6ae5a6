"""Durable runs: `submit` records a run in Redis and enqueues its first advance; the workers take it from
there (worker/cluster/advance.py). `cancel_run`, `resume_cluster`, `redrive_cluster` and `update_run` act on a
run found in whichever store recorded it (scheduler/lookup.py). Following a run (`wait`, `status`) reads
only and lives in scheduler/waiting.py, without Celery; its names are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ir.errors import IdempotencyConflict, ValidationError
from ir.loader import given_inputs
from scheduler.inputs import apply_inputs
from scheduler.inputs_file import read_encoded
from scheduler.lookup import cluster_runs, find_run
from scheduler.reach import broker_errors
from scheduler.waiting import status, wait
from worker import settings, tracing
from worker.batch import overrides
from worker.cluster import signing
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.batches.dispatch import send_advance
from worker.cluster.datasets import tasks
from worker.cluster.messages import Advance
from worker.cluster.state import idempotency, waits
from worker.cluster.state.runstate import RunState
from worker.engine.flow import build_flow
from worker.engine.loader import load, source_of
from worker.llm import usage
from worker.runs.record import FINAL, RunRecord, new_run_id, resume_refusal
from worker.runs.redrive import redrive_batch
from worker.runs.resume_point import go_on_under
from worker.runs.store import RunStore

__all__ = [
    "cancel_run",
    "redrive_cluster",
    "resume_cluster",
    "status",
    "submit",
    "update_run",
    "wait",
    "workers_registered",
]

#: The longest idempotency key a submit takes (a client with a longer one can send its hash).
MAX_KEY_LENGTH = 255


def submit(
    workflow: Any,
    inputs: dict[str, Any] | None = None,
    *,
    run_id: str | None = None,
    inputs_file: str | Path | None = None,
    idempotency_key: str | None = None,
    on_repeat: Callable[[str], None] | None = None,
    priority: str | None = None,
) -> str:
    """Validate, record the run in Redis, enqueue its first step; returns the run id at once.

    `priority` (high, normal, low; None: the workflow's `priority` field, else normal): where the run's chunks and
    advances go in the queue (worker/cluster/priorities.py).
    `inputs_file`: a JSON object of inputs, under `inputs` (which win where both name a key), read
    straight into the run's stored bytes: a large input is never built as objects in this process.
    `idempotency_key`: a key used before (within CHORDFLOW_RUN_TTL) returns that submit's run id and records
    nothing (`on_repeat` is told the id); with another workflow or other inputs it raises IdempotencyConflict.
    """
    if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
        raise ValidationError(f"idempotency key: 1 to {MAX_KEY_LENGTH} characters, got {len(idempotency_key)}")
    later = tracing.Later.begin()  # the run's span: the advance that ends the run emits it
    from_file = read_encoded(inputs_file) if inputs_file is not None else {}
    wf = load(workflow, [*(inputs or {}), *from_file])  # what the run is given is a known input
    store: dict[str, Any] = {}
    apply_inputs(wf, store, inputs, encoded=from_file)
    usage.start_list(wf, store)
    # A client without the key fails before it records anything; with it, the run's workflow is recorded signed.
    runs = cluster_runs(signing.publishing_signer(current_app()))
    run_id = run_id or new_run_id()
    record = RunRecord(run_id, wf.wire(), "celery", "queued", wf.start_id(), source=source_of(workflow))
    encoded = {k: v for k, v in from_file.items() if k not in store}
    record.priority = priority or wf.priority or "normal"
    # this process's span (loading the workflow and inputs) goes with the run's: no exporter is loaded here
    record.trace = later.handing("chordflow submit").wire() if later else None
    with broker_errors(settings.load().result_backend):
        if idempotency_key is not None:
            asked = _fingerprint(record, store, encoded)
            held = idempotency.claim(
                runs.redis, idempotency_key, run_id, asked, runs.ttl,  # type: ignore[attr-defined]
                lambda existing: runs.get(existing) is not None,
            )  # fmt: skip
            if held is not None:
                if held[1] != asked:
                    raise IdempotencyConflict(idempotency_key, held[0])
                if on_repeat is not None:
                    on_repeat(held[0])
                return held[0]
        try:
            runs.create(record, store, encoded=encoded)
        except BaseException as exc:  # part-way (Redis out of memory after the store): what it wrote goes
            with contextlib.suppress(Exception):
                status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
                runs.abandon(record, status, f"not recorded: {type(exc).__name__}: {exc}")  # type: ignore[attr-defined]
                if idempotency_key is not None:
                    idempotency.release(runs.redis, idempotency_key, run_id)  # type: ignore[attr-defined]
            raise
        try:
            send_advance(Advance(run_id, 0))
        except Exception as exc:  # recorded but never enqueued: say so in the record, not "queued" forever
            with contextlib.suppress(Exception):
                runs.set_status(run_id, "failed", f"not enqueued: {exc}")
            raise
    return run_id


def _fingerprint(record: RunRecord, store: dict[str, Any], encoded: dict[str, bytes]) -> str:
    """What a submit asked for, as one hash: its validated workflow and every input as stored (a retry of the same
    submit has the same; another workflow or other inputs under the same idempotency key do not)."""
    digest = hashlib.sha256(json.dumps([record.workflow, store], sort_keys=True, default=repr).encode())
    for name in sorted(encoded):
        digest.update(b"\0" + name.encode() + b"\0" + encoded[name])
    return digest.hexdigest()


def workers_registered() -> int:
    """Worker processes in the registry now (0: a submitted run waits in the queue for one)."""
    return chunking.registered_processes(settings.load().result_backend)


def cancel_run(run_id: str) -> int:
    """Set a run's cancel flag in Redis (chunks stop between items; no new step starts); returns how many
    queued chunks were revoked. A run driven by a client process (`scheduler.run(backend="celery")`) sees
    the flag and has its queued chunks revoked; a local run's process (on this host) is sent SIGTERM, which
    `chordflow run` takes as Ctrl-C.

    A cluster run's chunks are never revoked: a revoked chunk would leave its batch unmerged, so the merge task (which
    keeps the outcomes so far and records "cancelled") would never run and the run would stay "running".
    Its queued chunks see the flag as they start and return at once, without running an item.
    """
    record, runs = find_run(run_id)
    if record.status in FINAL:  # a local run whose process is gone too: it reads as failed
        raise ValidationError(f"run {run_id} already ended: {record.status}")
    if record.backend != "celery":  # its process cancels it on SIGTERM as on Ctrl-C
        held = runs.owner(run_id)
        if held is None or not held.cancel():
            where = f" (pid {held.pid} on {held.host})" if held is not None else ""
            raise ValidationError(f"run {run_id} is a local run: stop it with Ctrl-C in the process running it{where}")
        return 0
    state = RunState(run_id)
    state.cancel()
    waits.wake(state.redis, run_id)  # a waiting run holds no task to see the flag: its next advance goes now
    if record.dataset is not None:
        tasks.settle(run_id)
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
    if refusal := resume_refusal(record, workflow):
        raise ValidationError(refusal)
    step = record.step
    if workflow is not None:
        flow = build_flow(load(workflow, given_inputs(record.workflow)))
        step = go_on_under(runs, record, flow, source_of(workflow)).step
    state = RunState(run_id)
    state.clear_stops()
    runs.set_status(run_id, "queued", None)
    send_advance(Advance(run_id, step))


def redrive_cluster(run_id: str, node: str) -> int:
    """Hand a finished cluster run back to the workers from its batch node `node`, which runs its failed items
    again (worker/runs/redrive.py); returns how many items failed."""
    record, runs = find_run(run_id, signing.publishing_signer(current_app()))  # its record is written signed
    with broker_errors(settings.load().result_backend):
        plan = redrive_batch(runs, record, node)
        RunState(run_id).clear_stops()
        runs.set_status(run_id, "queued", None)
        send_advance(Advance(run_id, plan.step))
    return plan.failed


def _rebudget_local(record: RunRecord, runs: RunStore, changes: dict[str, Any]) -> dict[str, Any]:
    """A local run that stopped takes a new budget into its recorded workflow, which `resume` (`redrive`) reads; one
    still running holds its budget in its own process."""
    owner = runs.owner(record.run_id) if record.status not in FINAL else None
    if owner is not None and not owner.gone():
        raise ValidationError(f"run {record.run_id} is running in another process: change its budget once it stopped")
    budget = dict(record.workflow.get("budget") or {})
    budget.update({name.removeprefix("budget_"): value for name, value in changes.items()})
    runs.set_workflow(record.run_id, {**record.workflow, "budget": budget}, None, record.node)
    return changes


def update_run(run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Change a queued or running cluster run's batch limits and priority (worker/batch/overrides.py); returns
    the changes as recorded. Bad values, an unknown run, a run that ended, a local or client-driven run and a
    dataset job are each a ValidationError of one line."""
    changes = {name: value for name, value in changes.items() if value is not None}
    if found := overrides.problems(changes):
        raise ValidationError(found)
    record, runs = find_run(run_id)
    if not runs.durable and overrides.budget_only(changes):
        return _rebudget_local(record, runs, changes)
    if not runs.durable:
        raise ValidationError(
            f"run {run_id} is driven by the process that started it (a local run, or `scheduler.run` with the celery "
            "backend): only a submitted run's limits can be changed (a local run's budget once it stopped); stop it "
            "and run it again"
        )
    if record.dataset is not None and not overrides.budget_only(changes):
        raise ValidationError(f"run {run_id} is a dataset job: `update` changes a workflow run's batches and budget")
    with broker_errors(settings.load().result_backend):
        outcome = runs.update(run_id, changes)  # type: ignore[attr-defined]
    if outcome == "unknown":
        raise ValidationError(f"unknown run '{run_id}' (its record expired or was purged)")
    if outcome != "ok":
        raise ValidationError(f"run {run_id} already ended: {outcome}; only its budget can change (then resume)")
    return changes
