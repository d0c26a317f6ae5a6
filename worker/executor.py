"""The per-item executor loop and its middleware hooks.

`run_items` runs items through `PflowBatchNode.run_item` (isolated copy, retries, classification).
Everything cross-cutting — progress, fail-fast aborts, checkpoints, concurrency permits — hangs on it
as an ItemMiddleware rather than living inside the loop. The local backend and the Celery chunk task
both call this same loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from worker.outcome import ItemOutcome

if TYPE_CHECKING:
    from worker.batch import PflowBatchNode

DEFAULT_THREADS = 8


class ItemMiddleware:
    """Hooks around each item. Override what you need; all are no-ops by default."""

    def before_item(self, index: int) -> bool:
        """Return False to stop the loop before this item (abort, cancel)."""
        return True

    def after_item(self, outcome: ItemOutcome) -> None:
        pass

    def close(self) -> None:
        """Called once when the loop ends, however it ends (flush buffers, release permits)."""


class StopSignals(ItemMiddleware):
    """In-process stops: the run was cancelled (Ctrl-C, a closed stream), or — fail_fast — an item failed.

    One hook for both keeps the per-item cost of the default (fail_fast) batch to two cheap calls.
    """

    def __init__(self, cancelled: threading.Event, fail_fast: bool):
        self.cancelled, self.fail_fast = cancelled, fail_fast
        self.failed = False  # a plain flag: set once, read by every thread of the batch

    def before_item(self, index: int) -> bool:
        return not (self.failed or self.cancelled.is_set())

    def after_item(self, outcome: ItemOutcome) -> None:
        if self.fail_fast and outcome.error is not None:
            self.failed = True


def run_items(
    node: PflowBatchNode, indexed_items: Iterable[tuple[int, Any]], middleware: list[ItemMiddleware]
) -> list[ItemOutcome]:
    outcomes: list[ItemOutcome] = []
    run_item = node.run_item
    try:
        if not middleware:
            return [run_item(index, item) for index, item in indexed_items]
        before = [m.before_item for m in middleware]
        after = [m.after_item for m in middleware]
        append = outcomes.append
        for index, item in indexed_items:
            for check in before:
                if not check(index):
                    return outcomes
            outcome = run_item(index, item)
            append(outcome)
            for hook in after:
                hook(outcome)
        return outcomes
    finally:
        for m in middleware:
            m.close()


class _LockedIterator(Iterator[tuple[int, Any]]):
    def __init__(self, iterable: Iterable[tuple[int, Any]]):
        self._it = iter(iterable)
        self._lock = threading.Lock()

    def __next__(self) -> tuple[int, Any]:
        with self._lock:
            return next(self._it)


def run_in_process(node: PflowBatchNode, items: list[Any], middleware: list[ItemMiddleware]) -> list[ItemOutcome]:
    """Sequential, or with `batch.parallel` on a thread pool of `max_concurrent` clones of the node."""
    spec = node.batch
    if not spec.parallel or len(items) < 2:
        return run_items(node, enumerate(items), middleware)
    threads = min(spec.max_concurrent or DEFAULT_THREADS, len(items))
    shared_iter = _LockedIterator(enumerate(items))
    # Middleware close() must run once, after every thread: the threads get hook-only views.
    views = [_NoClose(m) for m in middleware]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"batch-{node.node_id}") as pool:
        futures = [pool.submit(run_items, node.clone(), shared_iter, views) for _ in range(threads)]
        outcomes = [o for f in futures for o in f.result()]
    for m in middleware:
        m.close()
    return outcomes


class _NoClose(ItemMiddleware):
    def __init__(self, inner: ItemMiddleware):
        self.before_item = inner.before_item
        self.after_item = inner.after_item
