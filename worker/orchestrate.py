"""`chordflow.advance`: the cluster's stepper. A submitted run lives in Redis and advances through it.

Each advance loads the run's checkpoint and runs nodes until the flow ends or a batch node dispatches
its chord; the chord body merges the chunks and enqueues the next advance. No task waits on another.
Fencing: an advance whose step is not the run's current step does nothing, and one lease per run
(renewed while the task runs, so it outlives no dead worker) keeps duplicates from running at once —
a duplicate that finds the lease taken retries later and is then fenced. So redelivery after a SIGKILL
and duplicated messages are harmless.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

import ir
from ir.errors import RunCancelled
from worker import context, redact
from worker.aggregate import BatchResult, merge
from worker.app import task
from worker.backend import BatchJob
from worker.cluster_runs import ClusterRuns, key
from worker.context import RunContext
from worker.dispatch import dispatch_batch
from worker.flow import build_flow
from worker.nodes import registry
from worker.remote import stored_batch_result
from worker.runs import FINAL, RECORD_STATUS, StepJournal
from worker.runstate import RunState
from worker.stepper import Cursor, batch_nodes, drive, ending

log = logging.getLogger(__name__)
#: Seconds a run's lease lasts without renewal (the holder renews it every third of that).
LEASE_SECONDS = 15


class Suspended(BaseException):  # a control-flow signal, not an error: nodes must not catch it
    """A batch was dispatched; this advance ends and the chord body enqueues the next one."""


class Lease:
    """One advance at a time per run: a Redis key with a TTL, renewed by a thread while held."""

    def __init__(self, runs: ClusterRuns, run_id: str):
        self.redis, self.name, self.token = runs.redis, key(run_id, "lease"), uuid.uuid4().hex
        self.stop = threading.Event()

    def acquire(self) -> bool:
        if not self.redis.set(self.name, self.token, nx=True, ex=LEASE_SECONDS):
            return False
        threading.Thread(target=self._renew, daemon=True, name="chordflow-lease").start()
        return True

    def _renew(self) -> None:
        while not self.stop.wait(LEASE_SECONDS / 3):
            if self.redis.get(self.name) == self.token.encode():
                self.redis.expire(self.name, LEASE_SECONDS)

    def release(self) -> None:
        self.stop.set()
        if self.redis.get(self.name) == self.token.encode():
            self.redis.delete(self.name)


class ClusterBatches:
    """The backend inside an advance: a batch's stored result when its chord has finished, else dispatch
    the chord for the items without an outcome and suspend."""

    name = "celery"

    def __init__(self, run_id: str, ctx: RunContext, runs: ClusterRuns, state: RunState):
        self.run_id, self.ctx, self.runs, self.state = run_id, ctx, runs, state

    def run_batch(self, job: BatchJob) -> BatchResult:
        if not job.items:
            return merge([], 0, job.batch.fail_fast)
        stored = self.state.batch_result(job.key)
        if stored is not None:
            return stored_batch_result(stored)
        if self.state.mark_dispatched(job.key):
            job.done = [c for c in self.runs.saved_chunks(self.run_id, job.key) if not c.failures]
            # The next advance starts at this batch node's step (not this advance's first step: nodes
            # before it in this advance were checkpointed, and the step fence must let it through).
            dispatch_batch(job, self.run_id, advance_step=self.ctx.step)
        raise Suspended


@task(name="chordflow.advance", bind=True, max_retries=None, acks_late=True)
def advance(self: Any, run_id: str, step: int) -> str:
    """Advance run `run_id` from `step` until the flow ends or a batch is dispatched."""
    runs = ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.status in FINAL or record.step != step:
        return "fenced"
    lease = Lease(runs, run_id)
    if not lease.acquire():
        raise self.retry(countdown=LEASE_SECONDS / 3)
    record = runs.get(run_id)  # again, under the lease: the holder before us may have moved the run on
    if record is None or record.status in FINAL or record.step != step:
        lease.release()
        return "fenced"
    state = RunState(run_id)
    ctx = RunContext()
    try:
        if state.cancelled():
            runs.set_status(run_id, "cancelled", "run cancelled")
            return "cancelled"
        flow = build_flow(ir.load(record.workflow, node_types=registry.names()))
        store = runs.load_store(run_id)
        ctx.backend = ClusterBatches(run_id, ctx, runs, state)
        ctx.cancelled = _CancelFlag(state)
        runs.set_status(run_id, "running", node=record.node)
        journal = StepJournal(runs, run_id, batch_nodes(flow))
        with context.using(ctx):
            cursor = drive(flow, Cursor(record.node, record.step), store, ctx, journal)
        status, error, _ = ending(flow, cursor, store, ctx.last_node)
        runs.set_status(run_id, RECORD_STATUS[status], error, ctx.last_node if error else None)
        log.info("run %s %s after %d steps", run_id, RECORD_STATUS[status], cursor.step)
        return RECORD_STATUS[status]
    except Suspended:
        return "dispatched"
    except RunCancelled:
        runs.set_status(run_id, "cancelled", "run cancelled", ctx.last_node)
        return "cancelled"
    except Exception as exc:
        runs.set_exception(run_id, exc)  # first: `wait` re-raises it as soon as it sees the status
        runs.set_status(run_id, "failed", redact.mask(f"{type(exc).__name__}: {exc}"), ctx.last_node)
        log.info("run %s failed at node %s: %s", run_id, ctx.last_node, exc)
        return "failed"
    finally:
        lease.release()


class _CancelFlag(threading.Event):
    """The run's cancel flag in Redis, read as the stepper's `cancelled` event between nodes."""

    def __init__(self, state: RunState):
        super().__init__()
        self.state = state

    def is_set(self) -> bool:
        return super().is_set() or self.state.cancelled()
