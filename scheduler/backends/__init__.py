"""Batch backends, looked up by name: `scheduler/backends/<name>.py` defines `create(run_id, ctx) -> Backend`.

`local` runs items in this process (worker.batch.backend.LocalBackend); `celery` fans them out as chunk tasks,
merged by a merge task.
May import `worker` and `ir`; only `celery.py` imports the cluster half.
"""

from __future__ import annotations

import importlib

from ir.errors import ValidationError
from worker.batch.backend import Backend
from worker.engine.context import RunContext

NAMES = ("local", "celery")


def create(name: str, run_id: str, ctx: RunContext) -> Backend:
    if name not in NAMES:
        raise ValidationError(f"backend: unknown backend '{name}' (choose from {', '.join(NAMES)})")
    module = importlib.import_module(f"scheduler.backends.{name}")
    return module.create(run_id, ctx)
