"""The Celery backend: one batch node = ONE chord of `run_chunk` tasks with an `aggregate` body.

The snapshot is encoded once per batch (inline under a size threshold, else stored once in Redis
by content hash); items travel per chunk. The scheduler then follows the run's progress stream
(one XREAD per wake-up, never a subscription per item) until the chord body is ready.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import kombu.exceptions
import redis
from celery import chord

from ir import snapshot
from ir.errors import BackendError, RemoteError, RunCancelled
from scheduler import chunking
from worker import events, settings
from worker.aggregate import BatchResult, merge
from worker.backend import BatchJob
from worker.context import RunContext
from worker.outcome import ItemOutcome
from worker.runstate import RunState

log = logging.getLogger(__name__)
POLL_MS = 200


def rebuild_exception(outcome: ItemOutcome) -> BaseException:
    """The worker's exception as its original type when importable here, else RemoteError."""
    name, module, message = outcome.exception_type, outcome.exception_module, outcome.error or ""
    try:
        cls = getattr(importlib.import_module(module or "builtins"), name or "")
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return cls(message)
    except Exception:  # unimportable module, missing name, or a constructor with other arguments
        pass
    return RemoteError(f"{module}.{name}" if module and module != "builtins" else str(name), message)


def create(run_id: str, ctx: RunContext) -> CeleryBackend:
    return CeleryBackend(run_id, ctx)


class CeleryBackend:
    name = "celery"

    def __init__(self, run_id: str, ctx: RunContext):
        from worker.app import ensure_configured

        self.app = ensure_configured()
        self.settings = settings.load()
        self.run_id = run_id
        self.ctx = ctx
        self.state = RunState(run_id)
        self.cancelled = ctx.cancelled
        self.stream_pos = "0-0"  # how far this run's progress stream has been read

    # -- dispatch -------------------------------------------------------------------------------
    def run_batch(self, job: BatchJob) -> BatchResult:
        fail_fast, items, node_id = job.batch.fail_fast, job.items, job.node_id
        if not items:
            return merge([], 0, fail_fast)
        from worker.tasks import aggregate, run_chunk

        blob = snapshot.encode(snapshot.snapshot_of(job.shared), label="shared")
        size = chunking.chunk_size(
            len(items),
            job.batch.chunk_size,
            chunking.worker_processes(self.app),
            self.settings.chunks_per_process,
            self.settings.max_chunk_size,
        )
        spans = chunking.slices(len(items), size)
        # Encode every slice before anything is enqueued: a value that cannot travel fails early.
        payloads = [snapshot.encode(items[a:b], label=f"batch '{node_id}' items[{a}:{b}]") for a, b in spans]
        snap: bytes | dict[str, str] = blob
        with broker_errors(self.settings.result_backend):
            if len(blob) > self.settings.snapshot_inline_bytes:
                snap = {"ref": self.state.store_snapshot(blob)}
            spec = job.spec.wire()
            batch = f"{node_id}#{uuid.uuid4().hex[:8]}"  # a node in a loop dispatches a fresh batch each time
            ids = [uuid.uuid4().hex for _ in spans]
            header = [
                run_chunk.signature(
                    ({"run": self.run_id, "batch": batch, "node": spec, "snap": snap, "start": a, "items": payload},),
                    task_id=task_id,
                    argsrepr=f"batch={node_id} items[{a}:{b}] run={self.run_id}",
                    kwargsrepr="{}",
                )
                for (a, b), payload, task_id in zip(spans, payloads, ids, strict=True)
            ]
            body = aggregate.signature(
                (
                    {
                        "run": self.run_id,
                        "batch": batch,
                        "node": node_id,
                        "count": len(items),
                        "fail_fast": fail_fast,
                    },
                ),
                argsrepr=f"batch={node_id} chunks={len(spans)} run={self.run_id}",
                kwargsrepr="{}",
            )
            self.state.record_chunks(ids)
            self.state.describe(status="running", node=node_id, items=len(items), chunks=len(spans))
            with self.app.backend.quiet():
                result = chord(header)(body)
        log.info("run %s: batch %s -> %d chunks of <= %d items", self.run_id, node_id, len(spans), size)
        try:
            blob = self._wait(result, batch, node_id, len(items))
        except (KeyboardInterrupt, RunCancelled):
            self.cancel()
            raise
        batch = BatchResult.from_wire(snapshot.decode(blob))
        if batch.failure is not None:
            batch.failure.exception = rebuild_exception(batch.failure) if batch.failure.exception_type else None
        self.state.describe(status="done")
        return batch

    # -- waiting -----------------------------------------------------------------------------------
    def _wait(self, result: Any, batch: str, node_id: str, total: int) -> bytes:
        """Follow the progress stream until the chord body announces the stored result.

        Each wake-up is one XREAD (blocking up to POLL_MS); between them the cancel flag and the chord's
        state are checked, so a chunk that crashed (the body never runs) fails the run instead of hanging.
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
                if self.cancelled.is_set() or self.state.cancelled():
                    raise RunCancelled(f"run {self.run_id} cancelled during batch node '{node_id}'")
                if not batches and result.failed():
                    raise BackendError(f"batch node '{node_id}': a chunk failed on a worker: {result.result}")

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
            self.state.describe(status="cancelled")
        except redis.RedisError as exc:
            log.warning("could not record the cancellation in Redis: %s", exc)


@contextlib.contextmanager
def broker_errors(url: str) -> Iterator[None]:
    """Turns a lost Redis connection into one clear BackendError instead of a traceback or a hang."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, kombu.exceptions.OperationalError, OSError) as exc:
        raise BackendError(f"lost the connection to Redis at {_safe(url)}: {exc}") from exc


def _safe(url: str) -> str:
    """The URL without its password."""
    if "@" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
