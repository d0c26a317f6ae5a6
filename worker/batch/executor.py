"""The ONE per-item executor and the loop that runs a slice of items through it.

`ItemExecutor.run(index, item)` applies the per-item rules of the batch contract (docs/ARCHITECTURE.md) —
the isolated copy `item_shared = dict(shared)`, the batch's retries, classification into an ItemOutcome — keeping every
per-item value in locals, never on a node instance. `run_items` runs a contiguous slice through it and
collects the outcomes into a columnar ChunkResult. Everything cross-cutting (progress, stops, permits)
hangs on the loop as ItemMiddleware (worker/batch/middleware.py). The local backend and the Celery chunk task
both call this same loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pocketflow import BaseNode

from ir.models import NodeSpec
from worker import redact
from worker.batch.aggregate import ChunkResult
from worker.batch.cloning import clone_node
from worker.batch.outcome import ItemOutcome, failure_of
from worker.store import is_dunder

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


def accumulator_keys(shared: Mapping[str, Any]) -> tuple[str, ...]:
    """Root-level dunder lists that exist before the batch (e.g. `__llm_calls__`)."""
    return tuple(k for k, v in shared.items() if is_dunder(k) and isinstance(v, list))


class ItemExecutor:
    """Runs one item of a batch node: `chain` (NamespacedNode > TemplateNode > node) on an isolated copy.

    The chain's nodes keep PocketFlow's per-call state (params, `cur_retry`), so concurrent items need
    their own executor: `clone()`.
    """

    def __init__(self, spec: NodeSpec, chain: BaseNode, shared: Mapping[str, Any]):
        assert spec.batch is not None
        self.spec, self.chain, self.shared = spec, chain, shared
        self.node_id, self.alias = spec.id, spec.batch.alias
        self.attempts, self.wait = spec.batch.max_retries, spec.batch.retry_wait
        self.accumulators = accumulator_keys(shared)

    def clone(self) -> ItemExecutor:
        return ItemExecutor(self.spec, clone_node(self.chain), self.shared)

    def run(self, index: int, item: Any) -> ItemOutcome:
        # One fresh list per accumulator for the whole item, across its attempts: every call an item
        # made (e.g. an LLM call before a retry or a raise) is accounted for.
        appended = {key: [] for key in self.accumulators} if self.accumulators else None
        for attempt in range(self.attempts):
            item_shared = dict(self.shared)
            item_shared[self.node_id] = {}
            item_shared[self.alias] = item
            item_shared["__index__"] = index
            if appended:
                item_shared.update(appended)
            try:
                action = self.chain._run(item_shared)
                break
            except Exception as exc:
                if attempt + 1 >= self.attempts:
                    outcome = ItemOutcome.raised(index, item, exc, redact.node_secrets(self.chain, item_shared))
                    outcome.appended = _collected(appended)
                    return outcome
                if self.wait > 0:
                    time.sleep(self.wait)
        namespace = item_shared.get(self.node_id, {})
        error = failure_of(action, namespace) if namespace or action == "error" else None
        if error is None:
            return ItemOutcome(index, namespace, None, None, None, _collected(appended))
        secrets = redact.node_secrets(self.chain, item_shared)
        return ItemOutcome.failed(index, namespace, error, item, _collected(appended), secrets)


def _collected(appended: dict[str, list] | None) -> dict[str, list] | None:
    return {k: v for k, v in appended.items() if v} or None if appended else None


def run_items(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware]
) -> ChunkResult:
    """Run `items` (item i has index start+i) through the executor, hooks around each.

    Outcomes go straight into a columnar ChunkResult (results list + failures), so nothing per item is
    kept beyond its result. A hook that stops the loop leaves a shorter, still contiguous, chunk.
    """
    results: list[Any] = []
    failures: list[ItemOutcome] = []
    appended: dict[str, list] = {}
    run_item, keep = executor.run, results.append
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


def run_in_process(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware]
) -> list[ChunkResult]:
    """Sequential: one chunk. With `batch.parallel`: `max_concurrent` threads, each with its own clone of
    the executor, take small contiguous blocks of items; the blocks are merged like distributed chunks."""
    batch = executor.spec.batch
    assert batch is not None
    if not batch.parallel or len(items) < 2:
        return [run_items(executor, items, start, middleware)]
    threads = min(batch.max_concurrent or DEFAULT_THREADS, len(items))
    size = max(1, min(64, len(items) // (threads * 8)))
    offsets = _LockedIterator(range(0, len(items), size))
    views = [_NoClose(m) for m in middleware]  # close() runs once, after every thread

    def work(clone: ItemExecutor) -> list[ChunkResult]:
        chunks = []
        for offset in offsets:
            block = items[offset : offset + size]
            chunks.append(run_items(clone, block, start + offset, views))
            if len(chunks[-1].results) < len(block):  # a hook stopped it: stop taking blocks
                break
        return chunks

    try:
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"batch-{executor.node_id}") as pool:
            futures = [pool.submit(work, executor.clone()) for _ in range(threads)]
            return [chunk for future in futures for chunk in future.result()]
    finally:
        for m in middleware:
            m.close()


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
