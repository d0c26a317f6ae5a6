"""A worker's exception, rebuilt on the side that reports it: its own type when importable, else
RemoteError naming the original type (README, batch errors)."""

from __future__ import annotations

import importlib

from ir import snapshot
from ir.errors import RemoteError
from worker.batch.aggregate import BatchResult
from worker.batch.outcome import ItemOutcome


def rebuild(module: str | None, name: str | None, message: str) -> BaseException:
    try:
        cls = getattr(importlib.import_module(module or "builtins"), name or "")
        if isinstance(cls, type) and issubclass(cls, BaseException):
            return cls(message)
    except Exception:  # unimportable module, missing name, or a constructor with other arguments
        pass
    return RemoteError(f"{module}.{name}" if module and module != "builtins" else str(name), message)


def rebuild_exception(outcome: ItemOutcome) -> BaseException:
    """A failed batch item's exception."""
    return rebuild(outcome.exception_module, outcome.exception_type, outcome.error or "")


def stored_batch_result(blob: bytes) -> BatchResult:
    """A batch result as the merge task stored it, with a fail_fast failure's exception rebuilt."""
    result = BatchResult.from_wire(snapshot.decode(blob))
    if result.failure is not None and result.failure.exception_type:
        result.failure.exception = rebuild_exception(result.failure)
    return result
