"""The per-item executor loop and its middleware hooks.

`run_items` runs items through `PflowBatchNode.run_item` (isolated copy, retries, classification)
and collects them into a columnar ChunkResult.
Everything cross-cutting — progress, stops (cancel, fail_fast), cluster-wide concurrency permits — hangs on it
as an ItemMiddleware rather than living inside the loop. The local backend and the Celery chunk task
both call this same loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from worker.aggregate import ChunkResult
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


def run_items(node: PflowBatchNode, items: Sequence[Any], start: int, middleware: list[ItemMiddleware]) -> ChunkResult:
    """Run `items` (item i has index start+i) through `node.run_item`, hooks around each.

    Outcomes go straight into a columnar ChunkResult (results list + failures), so nothing per item is
    kept beyond its result. A hook that stops the loop leaves a shorter, still contiguous, chunk.
    """
    results: list[Any] = []
    failures: list[ItemOutcome] = []
    appended: dict[str, list] = {}
    run_item, keep = node.run_item, results.append
    before = [m.before_item for m in middleware]
    after = [m.after_item for m in middleware]
    try:
        for index, item in enumerate(items, start):
            if not _may_start(before, index):
                break
            outcome = run_item(index, item)
            keep(outcome.result)
            if outcome.error is not None:
                failures.append(outcome)
            if outcome.appended:
                for key, entries in outcome.appended.items():
                    appended.setdefault(key, []).extend(entries)
            for hook in after:
                hook(outcome)
    finally:
        for m in middleware:
            m.close()
    return ChunkResult(start, results, failures, appended)


def _may_start(checks: list[Any], index: int) -> bool:
    # A plain loop, not all(<generator>): this runs once per item and the generator costs more than the checks.
    for check in checks:  # noqa: SIM110
        if not check(index):
            return False
    return True


def run_in_process(node: PflowBatchNode, items: list[Any], middleware: list[ItemMiddleware]) -> list[ChunkResult]:
    """Sequential: one chunk. With `batch.parallel`: `max_concurrent` threads, each with its own clone of
    the node, take small contiguous blocks of items; the blocks are merged like distributed chunks."""
    spec = node.batch
    if not spec.parallel or len(items) < 2:
        return [run_items(node, items, 0, middleware)]
    threads = min(spec.max_concurrent or DEFAULT_THREADS, len(items))
    size = max(1, min(64, len(items) // (threads * 8)))
    starts = _LockedIterator(range(0, len(items), size))
    views = [_NoClose(m) for m in middleware]  # close() runs once, after every thread

    def work(clone: PflowBatchNode) -> list[ChunkResult]:
        chunks = []
        for start in starts:
            block = items[start : start + size]
            chunks.append(run_items(clone, block, start, views))
            if len(chunks[-1].results) < len(block):  # a hook stopped it: stop taking blocks
                break
        return chunks

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"batch-{node.node_id}") as pool:
        futures = [pool.submit(work, node.clone()) for _ in range(threads)]
        chunks = [chunk for future in futures for chunk in future.result()]
    for m in middleware:
        m.close()
    return chunks


class _LockedIterator(Iterator[int]):
    def __init__(self, iterable: Iterable[int]):
        self._it = iter(iterable)
        self._lock = threading.Lock()

    def __next__(self) -> int:
        with self._lock:
            return next(self._it)


class _NoClose(ItemMiddleware):
    def __init__(self, inner: ItemMiddleware):
        self.before_item = inner.before_item
        self.after_item = inner.after_item
