"""Durable runs: `submit` records a run in Redis and enqueues its first advance; the workers take it from
there (worker/cluster/advance.py). `wait`, `status`, `cancel_run` and `resume_cluster` act on a run found
in whichever store recorded it (scheduler/lookup.py); a local run is followed through the embedded store.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ir.errors import BackendError, IdempotencyConflict, ValidationError, WaitTimeout
from ir.loader import given_inputs
from scheduler import datasets
from scheduler.backends.celery import broker_errors
from scheduler.inputs import apply_inputs
from scheduler.inputs_file import read_encoded
from scheduler.lookup import cluster_runs, find_run
from worker import events, settings
from worker.batch import overrides
from worker.batch.remote import rebuild
from worker.cluster import signing
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.batches.dispatch import send_advance
from worker.cluster.state import heartbeat, idempotency
from worker.cluster.state.progress import batches_of
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.engine.flow import build_flow
from worker.engine.loader import load, source_of
from worker.engine.stepper import outputs as recorded_outputs
from worker.nodes.llm import usage_totals
from worker.runs.record import FINAL, RESULT_STATUS, RunRecord, RunResult, new_run_id, resume_refusal
from worker.runs.redrive import redrive_batch
from worker.runs.resume_point import go_on_under
from worker.runs.store import RunStore, Unrecoverable

POLL_MS = 200
#: The shortest round of `wait`'s loop: a dataset job's chunks publish progress every few ms, and a round each
#: (reading the run's record again) cost `wait` 1.2 s of CPU over a million records; 25 ms rounds take the
#: entries that came meanwhile together, and see the run end at most that much later.
MIN_ROUND_SECONDS = 0.025
#: The longest idempotency key a submit takes (a client with a longer one can send its hash).
MAX_KEY_LENGTH = 255
#: How often `wait` checks whether a dataset job ended with nobody left to say so (its reader died).
SETTLE_SECONDS = 2


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
    from_file = read_encoded(inputs_file) if inputs_file is not None else {}
    wf = load(workflow, [*(inputs or {}), *from_file])  # what the run is given is a known input
    store: dict[str, Any] = {}
    apply_inputs(wf, store, inputs, encoded=from_file)
    # A client without the key fails before it records anything; with it, the run's workflow is recorded signed.
    runs = cluster_runs(signing.publishing_signer(current_app()))
    run_id = run_id or new_run_id()
    record = RunRecord(run_id, wf.wire(), "celery", "queued", wf.start_id(), source=source_of(workflow))
    encoded = {k: v for k, v in from_file.items() if k not in store}
    record.priority = priority or wf.priority or "normal"
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
            send_advance("chordflow.advance", (run_id, 0))
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


def status(run_id: str) -> dict[str, Any]:
    """The `chordflow status --json` object; its `batches` has the batch running now too (done/total/failed so
    far); a dataset job's has `records` (total, done, failed, rate, eta_s), a run whose store keeps
    `__llm_calls__` has `llm` (calls, input_tokens, output_tokens), a cluster run not ended `workers` (the
    registered workers' pool sizes, by hostname: who can work on it now)."""
    record, runs = find_run(run_id)
    info = record.status_dict()
    if isinstance(runs, ClusterRuns) and record.status not in FINAL:
        info["workers"] = heartbeat.pool_sizes(runs.redis)  # a host cut off or dead drops out within 3 beats
    if record.dataset is not None:
        info["records"] = datasets.progress(record)
    else:
        # a batch still running on the cluster (a submitted run, or one a client drives): its progress stream
        if record.backend == "celery" and record.status == "running":
            with broker_errors(settings.load().result_backend):
                for batch in batches_of(RunState(run_id).redis, run_id):
                    if not batch.finished or batch.node not in info["batches"]:
                        info["batches"][batch.node] = {"total": batch.total, "done": batch.done, "failed": batch.failed}
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
        round_start = time.monotonic()
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
        final = record.status in FINAL
        if final and on_event is None:  # raised out here: a node's own OSError is no lost connection to Redis
            if result is None:
                raise rebuild(*exception)
            return result
        # Events are read once more after the run ended: the last ones were written before its final status.
        while True:
            with broker_errors(settings.load().result_backend):
                if record.dataset is not None and not final and time.monotonic() > settle_at:
                    datasets.settle(record)
                    settle_at = time.monotonic() + SETTLE_SECONDS
                position, entries = state.read_progress(position, 0 if final else POLL_MS)
                if on_event is not None:  # parallel branches' events, as they happen (worker/cluster/advance.py)
                    branch_position, branch_events = state.read_branch_events(branch_position)
                    for event in branch_events:
                        on_event(event)
                batches = {batch for batch, packed in entries if packed} if on_event else set()
                totals = {batch: state.batch_total(batch) for batch in batches}  # one read per batch, not per entry
            for batch, packed in entries:
                if packed is not None and on_event is not None:
                    per_chunk = record.dataset is not None
                    _progress(batch, packed, totals[batch], seen, done, on_event, per_chunk)
            if not (final and entries):
                break
        if final:
            if result is None:
                raise rebuild(*exception)
            return result
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"run {run_id} is still {record.status} after {timeout:g}s (it goes on)")
        if (rest := round_start + MIN_ROUND_SECONDS - time.monotonic()) > 0:
            time.sleep(rest)


def _progress(
    batch: str,
    packed: bytes,
    total: int,
    seen: dict[str, bytearray],
    done: dict[str, int],
    on_event: Callable[[dict[str, Any]], None],
    per_chunk: bool,
) -> None:
    """`batch_progress` events for one stream entry's outcomes, each item once (a redelivered chunk repeats some):
    one per item; or, `per_chunk` (a dataset job's records, worker/batch/middleware.py ChunkProgress), one per
    failed record and one for the entry's records that succeeded. A dataset's total grows as its file is read, and
    may be read behind its outcomes: a record's outcome proves the total is past its index."""
    node = batch.split("#", 1)[0]
    outcomes = RunState.unpack_outcomes(packed)
    if per_chunk and outcomes:
        total = max(total, max(index for index, _ok in outcomes) + 1)
    flags = seen.setdefault(batch, bytearray(total))
    if len(flags) < total:
        flags.extend(bytes(total - len(flags)))
    total = max(total, len(flags))
    succeeded = None
    for index, ok in outcomes:
        if 0 <= index < total and not flags[index]:
            flags[index] = 1
            done[batch] = done.get(batch, 0) + 1
            if ok and per_chunk:
                succeeded = index
            else:
                on_event(events.batch_progress(node, index, done[batch], total, bool(ok)))
    if succeeded is not None:
        on_event(events.batch_progress(node, succeeded, done[batch], total, True))


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
    the flag and has its queued chunks revoked; a local run's process (on this host) is sent SIGTERM, which
    `chordflow run` takes as Ctrl-C.

    A cluster run's chunks are never revoked: a revoked chord member fails the chord, so its body (which
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
    if refusal := resume_refusal(record, workflow):
        raise ValidationError(refusal)
    step = record.step
    if workflow is not None:
        flow = build_flow(load(workflow, given_inputs(record.workflow)))
        step = go_on_under(runs, record, flow, source_of(workflow)).step
    state = RunState(run_id)
    state.clear_stops()
    runs.set_status(run_id, "queued", None)
    send_advance("chordflow.advance", (run_id, step))


def redrive_cluster(run_id: str, node: str) -> int:
    """Hand a finished cluster run back to the workers from its batch node `node`, which runs its failed items
    again (worker/runs/redrive.py); returns how many items failed."""
    record, runs = find_run(run_id, signing.publishing_signer(current_app()))  # its record is written signed
    with broker_errors(settings.load().result_backend):
        plan = redrive_batch(runs, record, node)
        RunState(run_id).clear_stops()
        runs.set_status(run_id, "queued", None)
        send_advance("chordflow.advance", (run_id, plan.step))
    return plan.failed


def update_run(run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Change a queued or running cluster run's batch limits and priority (worker/batch/overrides.py); returns
    the changes as recorded. Bad values, an unknown run, a run that ended, a local or client-driven run and a
    dataset job are each a ValidationError of one line."""
    changes = {name: value for name, value in changes.items() if value is not None}
    if found := overrides.problems(changes):
        raise ValidationError(found)
    record, runs = find_run(run_id)
    if not runs.durable:
        raise ValidationError(
            f"run {run_id} is driven by the process that started it (a local run, or `scheduler.run` with the celery "
            "backend): only a submitted run's limits can be changed; stop it and run it again"
        )
    if record.dataset is not None:
        raise ValidationError(f"run {run_id} is a dataset job: `update` changes a workflow run's batches")
    with broker_errors(settings.load().result_backend):
        outcome = runs.update(run_id, changes)  # type: ignore[attr-defined]
    if outcome == "unknown":
        raise ValidationError(f"unknown run '{run_id}' (its record expired or was purged)")
    if outcome != "ok":
        raise ValidationError(f"run {run_id} already ended: {outcome}; nothing to change")
    return changes
