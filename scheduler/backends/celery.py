"""The Celery backend: one batch node = `run_chunk` tasks merged by ONE `aggregate` task.

The snapshot is encoded once per batch (inline under a size threshold, else stored once in Redis
by content hash); items travel per chunk. The scheduler then follows the run's progress stream
(one XREAD per wake-up, never a subscription per item) until the merge task is done, renewing its lease on the
run meanwhile (`driver`: the run's record is in this process's embedded store, so the lease is how the cluster
learns that this process is gone, and forgets the messages the run left queued).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from ir.errors import BackendError, RunCancelled
from scheduler.reach import broker_errors, preflight
from worker import events, settings
from worker.batch.aggregate import BatchResult, merge
from worker.batch.backend import BatchJob
from worker.batch.remote import stored_batch_result
from worker.cluster.batches import chunking
from worker.cluster.batches.dispatch import dispatch_batch
from worker.cluster.rate_limits import RedisLimiter
from worker.cluster.state.runstate import DRIVER_LEASE, RunState, client
from worker.cluster.state.windows import BatchWindow
from worker.engine.context import RunContext

log = logging.getLogger(__name__)
POLL_MS = 200


def create(run_id: str, ctx: RunContext) -> CeleryBackend:
    """The run's batches go to the cluster, and so do its rate-limit buckets: nodes this process runs draw
    from the ones the workers share."""
    backend = CeleryBackend(run_id, ctx)
    ctx.limiter = RedisLimiter(client(backend.settings.result_backend))
    return backend


class CeleryBackend:
    name = "celery"

    def __init__(self, run_id: str, ctx: RunContext):
        from worker.cluster.app import current_app

        self.settings = settings.load()
        preflight(self.settings)
        self.app = current_app(self.settings)
        self.run_id = run_id
        self.ctx = ctx
        self.state = RunState(run_id)
        self.cancelled = ctx.cancelled
        self.stream_pos = "0-0"  # how far this run's progress stream has been read
        self.renew_at = 0.0  # when this process's lease on the run is next renewed (monotonic)

    # -- dispatch -------------------------------------------------------------------------------
    def run_batch(self, job: BatchJob) -> BatchResult:
        fail_fast, items, node_id = job.batch.fail_fast, job.items, job.node_id
        if not items:
            return merge([], 0, fail_fast)
        if not chunking.registered_processes(self.settings.result_backend):
            log.warning(chunking.NO_WORKER_HINT)
        with broker_errors(self.settings.result_backend):
            self._keep_driver()  # before the first message is recorded: aging keeps a live driver's messages
            window = dispatch_batch(job, self.run_id)
        batch = job.key
        try:
            merged = stored_batch_result(self._wait(window, batch, node_id, len(items)))
            if merged.stopped is not None and self.state.cancelled():  # `chordflow cancel` stopped the chunks
                raise RunCancelled(f"run {self.run_id} cancelled during batch node '{node_id}'")
        except (KeyboardInterrupt, RunCancelled):
            self.cancel()
            raise
        self.state.describe(status="done")
        return merged

    # -- waiting -----------------------------------------------------------------------------------
    def _wait(self, window: BatchWindow, batch: str, node_id: str, total: int) -> bytes:
        """Follow the progress stream until the merge announces the stored result.

        Each wake-up is one XREAD (blocking up to POLL_MS); between them the cancel flag and the batch's window
        are checked, so a chunk that crashed (the merge never runs) fails the run instead of hanging.
        """
        seen = bytearray(total) if self.ctx.sink is not None else None
        done = 0
        while True:
            with broker_errors(self.settings.result_backend):
                self.stream_pos, batches = self.state.read_progress(self.stream_pos, POLL_MS)
                for entry_batch, outcomes in batches:
                    if entry_batch != batch:
                        continue
                    if outcomes is None:
                        blob = self.state.batch_result(batch)
                        if blob is None:
                            raise BackendError(f"batch node '{node_id}': its result expired from Redis")
                        return blob
                    if seen is not None:
                        done = self._emit_progress(node_id, RunState.unpack_outcomes(outcomes), seen, done, total)
                self._keep_driver()
                if self.cancelled.is_set() or self.state.cancelled():
                    raise RunCancelled(f"run {self.run_id} cancelled during batch node '{node_id}'")
                if not self.state.exists():  # Redis came back without persistence, or was flushed
                    raise BackendError(
                        f"run {self.run_id}: its state was lost from Redis during batch node '{node_id}' "
                        "(restarted without persistence, or flushed); resubmit it"
                    )
                if not batches and (error := window.crashed()) is not None:
                    raise BackendError(error)

    def _keep_driver(self) -> None:
        """Renew this process's lease on the run (a few times per DRIVER_LEASE): the cluster has no record of a run
        driven here, so the lease running out is how it learns that this process ended or died, and forgets the
        run's queued messages (worker/cluster/aging.py)."""
        now = time.monotonic()
        if now >= self.renew_at:
            self.state.keep_driver()
            self.renew_at = now + DRIVER_LEASE / 5

    def _emit_progress(self, node_id: str, outcomes: list[Any], seen: bytearray, done: int, total: int) -> int:
        """One `batch_progress` event per item seen for the first time (a redelivered chunk repeats some)."""
        for index, ok in outcomes:
            if not seen[index]:
                seen[index] = 1
                done += 1
                self.ctx.emit(events.batch_progress(node_id, index, done, total, bool(ok)))
        return done

    def cancel(self) -> None:
        """Stop dispatch: set the cancel flag (chunks stop between items) and revoke queued chunks."""
        self.cancelled.set()
        try:
            self.state.cancel()
            self.app.control.revoke(self.state.chunk_ids())
            self.state.drop_snapshots()  # revoked chunks never run, running ones hold theirs decoded
            self.state.describe(status="cancelled")
        except redis.RedisError as exc:
            log.warning("could not record the cancellation in Redis: %s", exc)
