"""The embedded default: batches run in the calling process, their outcomes kept as they go (a batch cut short
resumes with them)."""

from __future__ import annotations

from worker.batch.backend import LocalBackend
from worker.engine.context import RunContext
from worker.runs.sqlite import LocalRuns


def create(run_id: str, ctx: RunContext) -> LocalBackend:
    runs = LocalRuns.default()
    return LocalBackend(
        ctx.cancelled,
        ctx.sink,
        keep=lambda job, chunks, counts: runs.save_chunks(run_id, job.key, chunks, counts),
        saved=lambda key: runs.saved_chunks(run_id, key),
    )
