"""Compile workflows, run and stream them, submit and follow durable runs, and the `chordflow` CLI.

The public functions come from scheduler/api.py, which loads the cluster half (Celery, Redis) only when
a call needs it: a local run never imports it. `scheduler` may import `worker` and `ir`, never the reverse.
"""

from ir.errors import RemoteError, RunCancelled
from scheduler.api import redrive, resume, run, status, stream, submit, update, wait
from scheduler.compiler import compile
from worker.runs.record import RunResult

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
    "update",
    "wait",
]
