"""The task that runs one chunk of a cluster dataset job (`chordflow.dataset_chunk`), and the sends and verdict
around it; the job's Redis state is store.py's `ClusterDataset`."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import astuple
from typing import Any

from celery.exceptions import Ignore

from ir.errors import RunPurged, SameForEveryItem
from worker import tracing
from worker.batch.aggregate import ChunkResult
from worker.cluster import logs, priorities, sending, signing
from worker.cluster.app import current_app, task
from worker.cluster.batches.tasks import chunk_executor
from worker.cluster.broker import deliveries
from worker.cluster.datasets.progress import record_hooks
from worker.cluster.datasets.store import ClusterDataset
from worker.cluster.messages import DATASET_CHUNK, DatasetChunk
from worker.cluster.state import budget as budgets
from worker.cluster.state.answers import RedisAnswers
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.datasets.chunks import run_chunk
from worker.datasets.job import RECORDS, Dataset, verdict
from worker.engine import context
from worker.engine.context import RunContext
from worker.runs.record import FINAL

log = logging.getLogger(__name__)


def send(run_id: str, ns: Sequence[int]) -> None:
    """The job's claimed chunks, at the run's priority (worker/cluster/priorities.py)."""
    if not ns:
        return
    app, priority = current_app(), ClusterRuns().priority(run_id)
    with app.backend.quiet():  # nobody waits on a chunk's Celery result: no subscription per message (a client's)
        for n in ns:
            sending.send(
                app, DatasetChunk(run_id, n), priority=priority, kind=priorities.CHUNK,
                argsrepr=f"records chunk={n} run={run_id}",
            )  # fmt: skip


def finish_run(run_id: str, runs: ClusterRuns | None = None) -> str:
    """Record the verdict of a job that ended (idempotent: a run already final is left as it is)."""
    runs = runs or ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.status in FINAL or record.dataset is None:
        return "fenced"
    dataset, ds = Dataset.from_json(record.dataset), ClusterDataset(run_id)
    counts = ds.counts()
    status, error = verdict(dataset, counts, RunState(run_id).cancelled(), ds)
    ds.drop_records()  # first: whoever sees the job ended sees it trimmed (its verdict is made of what stays)
    runs.set_status(run_id, status, error)  # trims the run's keys (ClusterRuns.trim), the per-record progress too
    done, failed = counts["done"], counts["failed"]
    logs.transition(run_id, record.status, status, node=RECORDS, items=done, failed=failed, error=error)
    return status


def go_on(run_id: str, state: str, claimed: list[int]) -> None:
    """After a step: send what it claimed; record the verdict when the job ended."""
    send(run_id, claimed)
    if state == "end":
        finish_run(run_id)


def settle(run_id: str) -> None:
    """End a job that has ended with no chunk left to say so: cancelled with nothing in flight, or whose
    reader died (its lease ran out) after its last chunk ran — sending first the chunks a dead reader had
    claimed but perhaps never sent. `cancel` and `wait` call it, from the client."""
    ds = ClusterDataset(run_id)
    send(run_id, ds.orphans())
    state, claimed = ds.check()
    if state == "end":
        finish_run(run_id)
    elif claimed:
        send(run_id, claimed)


def refuse(runs: ClusterRuns, run_id: str, status: str, exc: Exception, error: str | None = None) -> str:
    """A job whose record was altered, or whose records all meet the same error (a model's key refused), stops
    (chunks in flight run no more records) and ends failed: one WARNING line, the transition's, from the first
    chunk that saw it (the others find the job ended)."""
    RunState(run_id).abort(RECORDS)
    if status not in FINAL:
        runs.set_exception(run_id, exc)
        error = error or f"{type(exc).__name__}: {exc}"
        runs.set_status(run_id, "failed", error)
        logs.transition(run_id, status, "failed", node=RECORDS, error=error)
    return "refused"


@task(name=DATASET_CHUNK, bind=True, acks_late=True, ignore_result=True)
def dataset_chunk(self: Any, message: Any, *legacy: Any) -> str:
    """Run chunk n of a dataset job (its records without a successful outcome), store its outcomes, send the
    chunks that keeps in flight, and record the verdict when it was the last."""
    run_id, n = astuple(DatasetChunk.from_wire(message, *legacy))
    ds = ClusterDataset(run_id)
    if not ds.is_pending(n):  # delivered again after it was counted: send what it claimed, if still due
        go_on(run_id, ds.check()[0], [m for m in ds.claimed_by(n) if ds.is_pending(m)])
        return "duplicate"
    deliveries.fence_start(self, "records chunk")  # a stale delivery never takes the claim (broker/deliveries.py)
    claim = ds.mark_started(n)
    runs = ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.dataset is None:
        return "fenced"
    record.check_format()
    try:
        signing.check_run(self.app.signer, run_id, record)  # the workflow and dataset a key holder recorded
    except signing.WorkflowAltered as exc:
        return refuse(runs, run_id, record.status, exc)
    if record.status == "queued":
        runs.set_status(run_id, "running")
        logs.transition(run_id, "queued", "running", node=RECORDS)
    dataset = Dataset.from_json(record.dataset)
    state = RunState(run_id)
    size, records, bad, done = ds.chunk_inputs(n)
    chunk = ChunkResult(n * size, [], [], {})
    began, ran, failed = time.monotonic(), 0, 0
    if not state.should_stop(RECORDS):
        executor = chunk_executor(dataset.record_spec(record.workflow).wire(), runs.load_store(run_id))
        try:
            with (
                context.using(RunContext(answers=RedisAnswers(state), budget=budgets.in_redis(state))),  # model calls
                tracing.within(run_id, tracing.parent_of(record.trace)),
                tracing.span(f"chunk {RECORDS}", {"chordflow.chunk.start": n * size, "chordflow.items": len(records)}),
            ):
                chunk = run_chunk(
                    executor, records, bad, n * size, done,
                    lambda count: record_hooks(state, RECORDS),
                )  # fmt: skip
        except SameForEveryItem as exc:  # every record would meet it: the job stops at the first
            current = runs.get(run_id)
            return refuse(runs, run_id, current.status if current else "running", exc, str(exc))
        kept = len(done.results) - len(done.failures) if done is not None else 0  # a redrive's successes: not run
        ran, failed = len(chunk.results) - kept, len(chunk.failures)
    elif done is not None:
        chunk = done
    logs.chunk(run_id, RECORDS, f"{RECORDS}:{n}", n * size, ran, failed, time.monotonic() - began)
    if state.purged:  # seen by a stop check or a refused publish: nothing of the chunk is reported
        raise RunPurged(f"run {run_id} was purged: its records chunk {n} stopped and reports nothing")
    step, claimed = ds.finish(n, chunk, len(records), dataset, claim)
    if step == "purged":
        raise RunPurged(f"run {run_id} was purged: its records chunk {n} reports nothing")
    if step == "stale":  # this worker was paused (or cut off) past the bound: another delivery holds the chunk
        log.warning("run %s: records chunk %d was delivered again meanwhile: this outcome is dropped", run_id, n)
        raise Ignore()  # not a success: the chunk's task is the new delivery's to end
    go_on(run_id, step, claimed)
    return "finished"
