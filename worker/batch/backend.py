"""What a backend is: something that runs every item of a BatchJob and returns the merged BatchResult.

`LocalBackend` runs them in this process (the embedded default, and the default of a bare compiled
flow). The Celery backend lives in scheduler/backends/celery.py; the scheduler looks backends up by name
(scheduler/backends/__init__.py), so a new backend is one module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pocketflow import BaseNode

from ir.errors import RunCancelled
from ir.models import BatchSpec, NodeSpec
from worker import tracing
from worker.batch.aggregate import BatchResult, ChunkResult, merge
from worker.batch.checkpoints import Checkpoints
from worker.batch.executor import ItemExecutor, run_slice
from worker.batch.middleware import item_middleware, tolerance_of


@dataclass
class BatchJob:
    """One batch node's items to run: the node spec, the items, the store they copy from (`shared`),
    and `done` — chunks already finished (a resumed batch runs only the items they do not cover)."""

    spec: NodeSpec
    items: list[Any]
    shared: Mapping[str, Any]
    chain: BaseNode  # the compiled per-item chain (worker.engine.build.item_chain)
    key: str = ""  # identifies this dispatch of the node in run state (`<node id>#<step>`)
    done: list[ChunkResult] = field(default_factory=list)

    @property
    def batch(self) -> BatchSpec:
        assert self.spec.batch is not None
        return self.spec.batch

    @property
    def node_id(self) -> str:
        return self.spec.id

    def executor(self) -> ItemExecutor:
        return ItemExecutor(self.spec, self.chain, self.shared)

    def missing(self) -> list[tuple[int, int]]:
        """[start, end) ranges of items with no outcome in `done`."""
        gaps, position = [], 0
        for chunk in sorted(self.done, key=lambda c: c.start):
            if chunk.start > position:
                gaps.append((position, chunk.start))
            position = max(position, chunk.start + len(chunk.results))
        if position < len(self.items):
            gaps.append((position, len(self.items)))
        return gaps


class Backend(Protocol):
    """Runs every item of one batch and returns the merged result (`worker.batch.aggregate.merge`)."""

    name: str

    def run_batch(self, job: BatchJob) -> BatchResult: ...


class LocalBackend:
    """Items run in this process: sequentially, or on threads with `batch.parallel`."""

    name = "local"

    def __init__(
        self,
        cancelled: threading.Event | None = None,
        emit: Callable[[dict[str, Any]], None] | None = None,
        keep: Callable[[BatchJob, list[ChunkResult], dict[str, int]], None] | None = None,
        saved: Callable[[str], list[ChunkResult]] | None = None,
    ):
        self.cancelled = cancelled or threading.Event()
        self.emit = emit
        # told of the outcomes as the items finish, in chunks (worker/batch/checkpoints.py), with the batch's
        # counts so far ({total, done, failed}: what `status` shows of a batch still running)
        self.keep = keep
        self.saved = saved  # batch key -> outcomes a cut-short run of this batch kept

    def run_batch(self, job: BatchJob) -> BatchResult:
        if self.saved is not None and not job.done:  # a chunk with a failed item runs again, as on the cluster
            job.done = [chunk for chunk in self.saved(job.key) if not chunk.failures]
        executor = job.executor()
        done_before = sum(len(c.results) for c in job.done)
        hooks = item_middleware(
            job.node_id, len(job.items), job.batch.fail_fast, cancelled=self.cancelled, emit=self.emit,
            done_before=done_before, tolerance=tolerance_of(job.batch),
        )  # fmt: skip
        chunks = list(job.done)
        keep = self._keeper(job, done_before)
        attributes = {"chordflow.node": job.node_id, "chordflow.batch": job.key, "chordflow.items": len(job.items)}
        with tracing.span(f"batch {job.node_id}", attributes):
            for start, end in job.missing():
                kept = [] if keep is None else [Checkpoints(start, end - start, keep)]
                chunks.append(run_slice(executor, job.items[start:end], start, [*hooks, *kept]))
                if self.cancelled.is_set():
                    break
        if self.cancelled.is_set():
            raise RunCancelled(f"run cancelled during batch node '{job.node_id}'")
        return merge(chunks, len(job.items), job.batch.fail_fast)

    def _keeper(self, job: BatchJob, done_before: int) -> Callable[[list[ChunkResult]], None] | None:
        """What the batch's Checkpoints hand their chunks to: `keep`, with the batch's counts so far."""
        if self.keep is None:
            return None
        keep, counts = self.keep, {"total": len(job.items), "done": done_before, "failed": 0}

        def kept(chunks: list[ChunkResult]) -> None:  # one slice at a time: its writer thread, then its close
            counts["done"] += sum(len(c.results) for c in chunks)
            counts["failed"] += sum(len(c.failures) for c in chunks)
            keep(job, chunks, dict(counts))

        return kept
