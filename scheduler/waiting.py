"""Following a run: `wait` until it ends, `status` now — of a run in either store (scheduler/lookup.py); a
local run is followed through the embedded store, a cluster run through its record and progress stream.

It reads; it sends nothing, so Celery is not imported (`chordflow wait`, `status` and `results` start without it;
scheduler/durable.py sends). The one exception: a dataset job still running after SETTLE_SECONDS is checked for a
dead reader (`settle`, which may send the chunks that reader claimed), and Celery imported then.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ir.errors import BackendError, Unrecoverable, WaitTimeout
from scheduler.datasets import reading
from scheduler.lookup import find_run
from scheduler.reach import broker_errors
from worker import events, settings
from worker.batch.remote import rebuild
from worker.cluster.state import heartbeat
from worker.cluster.state.progress import batches_of
from worker.cluster.state.runstate import RunState, client
from worker.llm.usage import CALLS, usage_totals
from worker.runs.record import FINAL, RESULT_STATUS, RunRecord, RunResult
from worker.runs.store import RunStore

POLL_MS = 200
#: The shortest round of `wait`'s loop: a dataset job's chunks publish progress every few ms, and a round each
#: (reading the run's record again) cost `wait` 1.2 s of CPU over a million records; 25 ms rounds take the
#: entries that came meanwhile together, and see the run end at most that much later.
MIN_ROUND_SECONDS = 0.025
#: How often `wait` checks whether a dataset job ended with nobody left to say so (its reader died).
SETTLE_SECONDS = 2


def status(run_id: str) -> dict[str, Any]:
    """The `chordflow status --json` object; its `batches` has the batch running now too (done/total/failed so
    far); a dataset job's has `records` (total, done, failed, rate, eta_s), a run whose store keeps
    `__llm_calls__` has `llm` (calls, input_tokens, output_tokens), a cluster run not ended `workers` (the
    registered workers' pool sizes, by hostname: who can work on it now), a run at a `wait` node `waiting` (node,
    until: epoch seconds or null, event: its name or null, text: `waiting until 06:00:00 UTC`)."""
    record, runs = find_run(run_id)
    info = record.status_dict()
    if runs.durable and record.status not in FINAL:  # the workers drive it: a host cut off or dead drops out in 3 beats
        info["workers"] = heartbeat.pool_sizes(client())
    if record.dataset is not None:
        info["records"] = reading.progress(record)
        if calls := reading.model_calls(record):
            info["llm"] = usage_totals({CALLS: calls})
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
                    from worker.cluster.datasets import tasks  # Celery: only for a job left running

                    tasks.settle(run_id)
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
        return reading.result_of(record)
    store = runs.load_store(record.run_id)
    status = RESULT_STATUS[record.status]
    if status == "cancelled":
        return RunResult(store, "cancelled", "run cancelled", {}, record.run_id, record.updated - record.created)
    exception = runs.exception(record.run_id)
    if status == "failed" and exception is not None:
        raise rebuild(*exception)
    outputs: dict[str, Any] = {}
    if status == "success":  # the IR's models and the engine: only for a workflow's outputs, not a dataset job's
        from worker.engine.loader import load
        from worker.engine.stepper import outputs as recorded_outputs

        outputs = recorded_outputs(load(record.workflow), store)
    return RunResult(store, status, record.error, outputs, record.run_id, record.updated - record.created)
