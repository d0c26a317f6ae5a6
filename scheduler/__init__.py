"""Compile workflows, run and stream them on a backend, and the `chordflow` CLI."""

from ir.errors import RemoteError, RunCancelled
from scheduler.compiler import compile
from scheduler.engine import RunResult, resume, run, stream

__all__ = ["RemoteError", "RunCancelled", "RunResult", "compile", "resume", "run", "stream"]
