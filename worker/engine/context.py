"""The run context: what a running workflow needs that is not data (event sink, batch backend, step).

It lives in a ContextVar, never in the shared store, so nothing internal travels in a snapshot.
Outside `scheduler.run` a default context runs batches in-process and drops events.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from worker.batch.backend import Backend, LocalBackend


@dataclass
class RunContext:
    sink: Callable[[dict[str, Any]], None] | None = None  # receives events (docs/ARCHITECTURE.md, events)
    cancelled: threading.Event = field(default_factory=threading.Event)
    backend: Backend | None = None  # set in __post_init__: the in-process backend unless one is given
    last_node: str | None = None
    step: int = 0  # the step being executed: batch keys are `<node id>#<step>`
    # Told when a node starts (the CLI's "running <node>" spinner); not an event, so streams stay as documented.
    on_node_start: Callable[[str], None] | None = None
    # Runs a parallel section's branches (worker/engine/sections.py ThreadedSections, or a cluster run's forking one);
    # None: threads of this process with in-process batches.
    sections: Any = None
    # Where rate-limit buckets live (worker/engine/rate_limits.py Limiter); None: this process's.
    limiter: Any = None
    # Where the run's model answers are kept (worker/llm/answers.py Answers); None: not kept (no run).
    answers: Any = None
    # The run's budget for model calls (worker/llm/budget.py Budget); None: no budget.
    budget: Any = None
    # Where the run's waits and signals live (worker/waits.py Waits); None: in memory (a flow run with no record).
    waits: Any = None

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = LocalBackend(self.cancelled, self.sink)

    def emit(self, event: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(event)

    def batch_key(self, node_id: str) -> str:
        return f"{node_id}#{self.step}"


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar("chordflow_run", default=None)


def current() -> RunContext:
    ctx = _current.get()
    if ctx is None:
        ctx = RunContext()
        _current.set(ctx)
    return ctx


@contextlib.contextmanager
def using(ctx: RunContext) -> Iterator[RunContext]:
    token = enter(ctx)
    try:
        yield ctx
    finally:
        leave(token)


def enter(ctx: RunContext) -> contextvars.Token:
    """Make `ctx` current until `leave(token)`: `using` without a generator, for a sub-run per dataset record."""
    return _current.set(ctx)


def leave(token: contextvars.Token) -> None:
    _current.reset(token)
