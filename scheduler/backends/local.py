"""The embedded default: batches run in the calling process."""

from __future__ import annotations

from worker.backend import LocalBackend
from worker.context import RunContext


def create(run_id: str, ctx: RunContext) -> LocalBackend:
    return LocalBackend(ctx.cancelled, ctx.sink)
