"""The ONE per-item executor and the loop that runs a slice of items through it.

`ItemExecutor.settle(index, item)` (and `run`, which always returns an ItemOutcome) applies the per-item rules of the
batch contract (docs/ARCHITECTURE.md) — the isolated copy `item_shared = dict(shared)`, the batch's retries,
classification into an ItemOutcome — keeping every per-item value in locals, never on a node instance. `run_items`
runs a contiguous slice through it and collects the outcomes into a columnar ChunkResult. Everything cross-cutting
(progress, stops, permits) hangs on the loop as ItemMiddleware (worker/batch/middleware.py). With `batch.parallel`,
`run_parallel` runs the slice on threads instead, with the same outcome. The local backend and the Celery chunk task
both call `run_slice`, which picks one of the two.

A stop middleware's StopSignal (worker/stopping.py) is installed while a loop runs, so the waits of its items end
with the stop: an item a wait gave up on (Stopped) has no outcome, as an item the stop kept from starting.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pocketflow import BaseNode

from ir.errors import Outage, SameForEveryItem
from ir.models import BatchSpec, NodeSpec
from worker import redact, stopping, tracing
from worker.batch.aggregate import ChunkResult
from worker.batch.cloning import clone_node, runner
from worker.batch.outcome import ItemOutcome, failure_of
from worker.store import is_dunder

DEFAULT_THREADS = 8


class ItemMiddleware:
    """Hooks around each item. Override what you need; all are no-ops by default.

    A parallel loop (`run_parallel`) calls the hooks from several threads at once: state they keep across
    items must be per thread or under a lock.
    """

    #: before_item may wait for something other chunks share (a permit). A parallel loop then calls it outside
    #: its claim lock, before the thread claims an item (with the next unclaimed index), so one thread's wait
    #: never holds up the others.
    waits = False
    #: False: `after_item` only cares about failed items (a stop on failures), and the loop calls it for those only.
    every_item = True
    #: The stop this middleware sets (cancel, abort): installed while the loop runs, so items' waits end with it.
    stop: stopping.StopSignal | None = None

    def before_item(self, index: int) -> bool:
        """Return False to stop the loop before this item (abort, cancel)."""
        return True

    def after_item(self, outcome: ItemOutcome) -> None:
        pass

    def follow(self, chunk: ChunkResult) -> bool:
        """A sequential loop offers the ChunkResult it collects its outcomes in, before its first item: return True
        to read them there (from another thread, say, or at `close`) and be called `after_item` for failed items
        only. The loop appends a failed item's outcome to `chunk.failures` before its result to `chunk.results`, so
        every failure below the length of `results` read first is there. Offered only when items append to no
        accumulators."""
        return False

    def enter_thread(self) -> None:
        """A thread of a parallel loop starts (give it what the caller's thread has that threads do not inherit)."""

    def leave_thread(self) -> None:
        """A thread of a parallel loop takes no more items: release what it holds for itself (its permit)."""

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
        self.call = runner(chain)  # the chain compiled once: one call per item (worker/batch/cloning.py)
        self.traced = tracing.item_threshold()  # which items get a span (None: tracing is off)

    def clone(self) -> ItemExecutor:
        return ItemExecutor(self.spec, clone_node(self.chain), self.shared)

    def run(self, index: int, item: Any) -> ItemOutcome:
        result, outcome = self.settle(index, item)
        return ItemOutcome(index, result) if outcome is None else outcome

    def settle(self, index: int, item: Any) -> tuple[Any, ItemOutcome | None]:
        """Run one item: (its result, None) when it succeeded and appended to no accumulator (the usual item: no
        ItemOutcome built for it), else (its result, its ItemOutcome)."""
        traced = self.traced
        if traced is None:
            return self._settle(index, item)
        if (index * tracing.SPREAD) & tracing.MASK < traced:  # tracing.picked, inlined: this runs per item
            with tracing.item(self.node_id, index) as on:
                result, outcome = self._settle(index, item)
                if outcome is not None and outcome.error is not None:
                    tracing.failed(on, outcome.error)
                return result, outcome
        start = time.time_ns()  # not picked: a span only if it fails
        result, outcome = self._settle(index, item)
        if outcome is not None and outcome.error is not None and (later := tracing.Later.begin(start)):
            later.end(f"item {self.node_id}", {"chordflow.node": self.node_id, "chordflow.index": index}, outcome.error)
        return result, outcome

    def _settle(self, index: int, item: Any) -> tuple[Any, ItemOutcome | None]:
        # One fresh list per accumulator for the whole item, across its attempts: every call an item
        # made (e.g. an LLM call before a retry or a raise) is accounted for.
        appended = {key: [] for key in self.accumulators} if self.accumulators else None
        node_id, attempt = self.node_id, 1
        while True:
            item_shared = dict(self.shared)
            item_shared[node_id] = {}
            item_shared[self.alias] = item
            item_shared["__index__"] = index
            if appended:
                item_shared.update(appended)
            try:
                action = self.call(item_shared)
                break
            except Outage:
                raise  # chordflow's state out of reach is not this item's failure: the chunk is given back
            except SameForEveryItem:
                raise  # the batch's failure, not the item's: every other item would meet it too
            except Exception as exc:
                if attempt >= self.attempts:
                    outcome = ItemOutcome.raised(index, item, exc, redact.node_secrets(self.chain, item_shared))
                    outcome.appended = _collected(appended)
                    return None, outcome
                attempt += 1
                if self.wait > 0:
                    stopping.sleep(self.wait)
        namespace = item_shared.get(node_id, {})
        error = failure_of(action, namespace) if namespace or action == "error" else None
        if error is None:
            appended = appended and _collected(appended)
            return namespace, None if appended is None else ItemOutcome(index, namespace, appended=appended)
        secrets = redact.node_secrets(self.chain, item_shared)
        outcome = ItemOutcome.failed(index, namespace, error, item, _collected(appended), secrets)
        return outcome.result, outcome


def _collected(appended: dict[str, list] | None) -> dict[str, list] | None:
    return {k: v for k, v in appended.items() if v} or None if appended else None


def stop_of(middleware: Sequence[ItemMiddleware]) -> stopping.StopSignal | None:
    """The stop signal the loop's middleware sets, if any."""
    return next((m.stop for m in middleware if m.stop is not None), None)


def run_items(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware]
) -> ChunkResult:
    """Run `items` (item i has index start+i) through the executor, hooks around each.

    Outcomes go straight into a columnar ChunkResult (results list + failures), so nothing per item is
    kept beyond its result. A hook that stops the loop, or a stop that ends an item's wait, leaves a shorter,
    still contiguous, chunk.
    """
    results: list[Any] = []
    failures: list[ItemOutcome] = []
    appended: dict[str, list] = {}
    chunk = ChunkResult(start, results, failures, appended)
    settle, keep = executor.settle, results.append
    before, (after, after_failed) = hooks(middleware, "before_item"), _after_hooks(middleware)
    if not executor.accumulators and (following := {id(m) for m in middleware if m.follow(chunk)}):
        after_failed = [hook for hook in after if id(hook.__self__) in following] + after_failed
        after = [hook for hook in after if id(hook.__self__) not in following]
    check = before[0] if len(before) == 1 else None  # one stop hook (the usual): called as it is
    try:
        with stopping.scope(stop_of(middleware)):  # a wait the stop ended ends the loop: that item has no outcome
            for index, item in enumerate(items, start):
                if check is not None:
                    if not check(index):
                        break
                elif before and not _may_start(before, index):
                    break
                result, outcome = settle(index, item)
                if outcome is None:  # succeeded, nothing appended: an ItemOutcome only for hooks that see every item
                    keep(result)
                    if after:
                        outcome = ItemOutcome(index, result)
                        for hook in after:
                            hook(outcome)
                    continue
                if outcome.error is not None:
                    failures.append(outcome)  # before its result: what a follower reads (`ItemMiddleware.follow`)
                keep(result)
                if outcome.appended:
                    for key, entries in outcome.appended.items():
                        appended.setdefault(key, []).extend(entries)
                for hook in after:
                    hook(outcome)
                if outcome.error is not None:
                    for hook in after_failed:
                        hook(outcome)
    finally:
        for m in middleware:
            m.close()
    return chunk


def hooks(middleware: Sequence[ItemMiddleware], name: str) -> list[Any]:
    """The bound `name` hooks of the middleware that override it: the loop calls no inherited no-op per item."""
    base = getattr(ItemMiddleware, name)
    return [getattr(m, name) for m in middleware if getattr(type(m), name) is not base]


def _after_hooks(middleware: Sequence[ItemMiddleware]) -> tuple[list[Any], list[Any]]:
    """The `after_item` hooks called for every item, and those called for failed items only (`every_item`
    False), each in the middleware's order."""
    after = hooks(middleware, "after_item")
    return [h for h in after if h.__self__.every_item], [h for h in after if not h.__self__.every_item]


def _may_start(checks: list[Any], index: int) -> bool:
    # A plain loop, not all(<generator>): this runs once per item and the generator costs more than the checks.
    for check in checks:  # noqa: SIM110
        if not check(index):
            return False
    return True


def threads_for(batch: BatchSpec, count: int) -> int:
    """Threads a slice of `count` items runs on: 1 unless `batch.parallel`; else `max_concurrent` (default
    DEFAULT_THREADS), never more than the items."""
    if not batch.parallel:
        return 1
    return max(1, min(batch.max_concurrent or DEFAULT_THREADS, count))


def run_slice(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware]
) -> ChunkResult:
    """The loop every backend runs a slice of a batch with (in-process and a worker's chunk alike):
    `run_items`, or with `batch.parallel` `run_parallel`; one contiguous ChunkResult either way."""
    batch = executor.spec.batch
    assert batch is not None
    threads = threads_for(batch, len(items))
    if threads < 2:
        return run_items(executor, items, start, middleware)
    return run_parallel(executor, items, start, middleware, threads)


def run_parallel(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware], threads: int
) -> ChunkResult:
    """`items` on `threads` threads, each with its own clone of the executor (pocketflow keeps retry state on
    node instances) and its own copy of the caller's contextvars: ThreadPoolExecutor does not carry them, and
    the run context (event sink, rate limiter, cancel flag) lives in one (worker/engine/context.py).

    Threads claim items one at a time in index order, and the stop hooks run under the claim lock, so the items
    that ran are always a prefix of `items`, as in a sequential loop: one contiguous ChunkResult, which is what a
    worker's chunk must return. Results land in their slot; failures and accumulator entries are put back in
    index order at the end. Threads start one at a time, each once the one before it was admitted (`_Crew`).
    Items a stop interrupted (Stopped) cut the chunk before the first of them: items after it that ended are
    dropped too (they run again if the batch is resumed), so the chunk stays a prefix.
    """
    with stopping.scope(stop_of(middleware)):  # before the crew copies the context: its threads see it
        return _parallel(executor, items, start, middleware, threads)


def _parallel(
    executor: ItemExecutor, items: Sequence[Any], start: int, middleware: Sequence[ItemMiddleware], threads: int
) -> ChunkResult:
    checks = hooks(middleware, "before_item")
    claims = _Claims(start, len(items), [c for c in checks if not c.__self__.waits])
    waits = [c for c in checks if c.__self__.waits]
    after, after_failed = _after_hooks(middleware)
    results: list[Any] = [None] * len(items)
    interrupted: list[int] = []  # offsets of items a stop ended mid-wait
    crew = _Crew(threads, contextvars.copy_context(), f"batch-{executor.node_id}")

    def work(clone: ItemExecutor) -> tuple[list[ItemOutcome], list[tuple[int, dict[str, list]]]]:
        failures: list[ItemOutcome] = []
        appended: list[tuple[int, dict[str, list]]] = []
        entered: list[ItemMiddleware] = []
        first = True
        try:
            for m in middleware:
                m.enter_thread()
                entered.append(m)
            while claims.left():
                if not _may_start(waits, claims.upcoming()):
                    claims.stop()  # a wait ended by a stop (cancel, abort): the others stop too
                    break
                if first:  # admitted (its permit held): the next thread may start asking for one
                    first = False
                    if claims.left():
                        crew.start(work, executor.clone())
                offset = claims.claim()
                if offset is None:
                    break
                try:
                    outcome = clone.run(start + offset, items[offset])
                except stopping.Stopped:
                    interrupted.append(offset)
                    claims.stop()
                    break
                results[offset] = outcome.result
                if outcome.appended:
                    appended.append((offset, outcome.appended))
                for hook in after:
                    hook(outcome)
                if outcome.error is not None:
                    failures.append(outcome)
                    for hook in after_failed:
                        hook(outcome)
        except BaseException:
            claims.stop()
            raise
        finally:
            for m in reversed(entered):
                m.leave_thread()
        return failures, appended

    try:
        crew.start(work, executor.clone())
        parts = crew.results()
    finally:
        for m in middleware:
            m.close()
    taken = min([claims.taken, *interrupted])
    del results[taken:]
    failures = sorted((f for part, _ in parts for f in part if f.index < start + taken), key=lambda f: f.index)
    appended: dict[str, list] = {}
    for _, entries in sorted((e for _, part in parts for e in part if e[0] < taken), key=lambda e: e[0]):
        for key, values in entries.items():
            appended.setdefault(key, []).extend(values)
    return ChunkResult(start, results, failures, appended)


class _Crew:
    """The threads of one parallel slice, started one at a time: a thread starts the next once it is admitted
    to its first item (a permit held, on a worker), so a slice never has more threads than it has permits plus
    the one asking for the next. Sixty-four chunks on one worker each allowed 64 threads start no thousands of
    threads polling for 64 permits."""

    def __init__(self, most: int, context: contextvars.Context, name: str):
        self.most, self.context = most, context
        self.pool = ThreadPoolExecutor(max_workers=most, thread_name_prefix=name)
        self.futures: list[Any] = []
        self.running = 0
        self.idle = threading.Condition()

    def start(self, work: Any, clone: ItemExecutor) -> None:
        """Start one more thread running `work(clone)` in a copy of the caller's contextvars, up to `most`."""
        with self.idle:
            if len(self.futures) >= self.most:
                return
            self.running += 1
            self.futures.append(self.pool.submit(self.context.copy().run, self._tracked, work, clone))

    def _tracked(self, work: Any, clone: ItemExecutor) -> Any:
        try:
            return work(clone)
        finally:
            with self.idle:
                self.running -= 1
                self.idle.notify_all()

    def results(self) -> list[Any]:
        """Wait for every thread started (also those started while waiting); their results in start order."""
        with self.idle:
            self.idle.wait_for(lambda: self.running == 0)
        self.pool.shutdown(wait=True)
        return [future.result() for future in self.futures]


class _Claims:
    """Hands out a slice's offsets in order. The stop hooks (`checks`) run under its lock before each claim,
    so once one says stop no later item starts: the claimed offsets are always 0..taken-1."""

    def __init__(self, start: int, count: int, checks: list[Any]):
        self.start, self.count, self.checks = start, count, checks
        self.taken = 0
        self.stopped = False
        self.lock = threading.Lock()

    def left(self) -> bool:
        return not self.stopped and self.taken < self.count

    def upcoming(self) -> int:
        return self.start + self.taken

    def claim(self) -> int | None:
        with self.lock:
            if self.stopped or self.taken >= self.count:
                return None
            if not _may_start(self.checks, self.start + self.taken):
                self.stopped = True
                return None
            self.taken += 1
            return self.taken - 1

    def stop(self) -> None:
        with self.lock:
            self.stopped = True
