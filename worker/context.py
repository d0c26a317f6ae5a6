"""The run context: what a running workflow needs that is not data (event sink, batch backend).

It lives in a ContextVar, never in the shared store, so nothing internal travels in a snapshot.
Outside `scheduler.run` a default context runs batches in-process and drops events.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from worker.aggregate import BatchResult
    from worker.batch import PflowBatchNode
    from worker.executor import ItemMiddleware


class BatchBackend(Protocol):
    """Runs every item of one batch and returns the merged result (`worker.aggregate.merge`)."""

    def run_batch(self, node: PflowBatchNode, items: list[Any]) -> BatchResult: ...


@dataclass
class RunContext:
    backend: BatchBackend | None = None  # None: batches run in-process
    sink: Callable[[dict[str, Any]], None] | None = None  # receives events (DESIGN section 6)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # Extra in-process item hooks per batch: (node_id, total) -> middleware (e.g. progress events).
    item_middleware: Callable[[str, int], list[ItemMiddleware]] | None = None
    last_node: str | None = None
    # Told when a node starts (the CLI's "running <node>" spinner); not an event, so streams stay as documented.
    on_node_start: Callable[[str], None] | None = None

    def emit(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(event)


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("chordflow_run", default=None)


def current() -> RunContext:
    ctx = _current.get()
    if ctx is None:
        ctx = RunContext()
        _current.set(ctx)
    return ctx


@contextlib.contextmanager
def using(ctx: RunContext) -> Iterator[RunContext]:
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)
