"""Compile workflows, run and stream them on a backend, durable runs, and the `chordflow` CLI."""

from typing import Any

from ir.errors import RemoteError, RunCancelled
from scheduler.compiler import compile
from scheduler.engine import RunResult, resume, run, stream

__all__ = [
    "RemoteError",
    "RunCancelled",
    "RunResult",
    "compile",
    "redrive",
    "resume",
    "run",
    "status",
    "stream",
    "submit",
    "wait",
]
_DURABLE = ("submit", "status", "wait", "redrive")


def __getattr__(name: str) -> Any:
    """`submit`, `status`, `wait` (scheduler/durable.py) import Celery: loaded when first asked for, so a
    local run never pays for it."""
    if name in _DURABLE:
        from scheduler import durable

        return getattr(durable, name)
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
