"""Compile workflows, run and stream them, submit and follow durable runs, and the `chordflow` CLI.

The public functions come from scheduler/api.py, which loads the cluster half (Celery, Redis) only when
a call needs it: a local run never imports it. They are imported on first use (`scheduler.run`), so the CLI's
`validate` does not load the run machinery. `scheduler` may import `worker` and `ir`, never the reverse.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ir.errors import RemoteError, RunCancelled
    from scheduler.api import (
        list_schedules,
        pause_schedule,
        redrive,
        resume,
        resume_schedule,
        run,
        schedule,
        signal,
        status,
        stream,
        submit,
        unschedule,
        update,
        wait,
    )
    from scheduler.compiler import compile
    from worker.runs.record import RunResult

#: Each public name and the module it comes from.
_PUBLIC = {
    "RemoteError": "ir.errors",
    "RunCancelled": "ir.errors",
    "RunResult": "worker.runs.record",
    "compile": "scheduler.compiler",
    "list_schedules": "scheduler.api",
    "pause_schedule": "scheduler.api",
    "redrive": "scheduler.api",
    "resume": "scheduler.api",
    "resume_schedule": "scheduler.api",
    "run": "scheduler.api",
    "schedule": "scheduler.api",
    "signal": "scheduler.api",
    "status": "scheduler.api",
    "stream": "scheduler.api",
    "submit": "scheduler.api",
    "unschedule": "scheduler.api",
    "update": "scheduler.api",
    "wait": "scheduler.api",
}
__all__ = [
    "RemoteError",
    "RunCancelled",
    "RunResult",
    "compile",
    "list_schedules",
    "pause_schedule",
    "redrive",
    "resume",
    "resume_schedule",
    "run",
    "schedule",
    "signal",
    "status",
    "stream",
    "submit",
    "unschedule",
    "update",
    "wait",
]


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value
