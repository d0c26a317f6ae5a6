"""The in-process ItemMiddleware hung on the per-item loop, and `item_middleware`, which builds its stack.

StopSignals (cancel, fail_fast, failure threshold) and ProgressEvents. A failure threshold
(`batch.tolerated_failure_percent` / `_count`) stops a batch once its failed items exceed it; StopSignals
counts them. The verdict itself is taken on the merged outcomes (`worker.engine.batch_node.judge_failures`).
A worker's chunk wears the Redis-backed equivalents instead (worker/cluster/batches/middleware.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ir.models import BatchSpec
from worker import events, stopping
from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemMiddleware
from worker.batch.outcome import ItemOutcome
from worker.batch.thresholds import Tolerance

#: A batch without a failure threshold.
NO_THRESHOLD = Tolerance()


def item_middleware(
    node_id: str,
    total: int,
    fail_fast: bool,
    *,
    cancelled: threading.Event | None = None,
    emit: Callable[[dict[str, Any]], None] | None = None,
    done_before: int = 0,
    tolerance: Tolerance = NO_THRESHOLD,
    per_chunk: bool = False,
) -> list[ItemMiddleware]:
    """The hooks around a batch's items in this process, stops first (`total`: the batch's items; `per_chunk`:
    progress as ChunkProgress gives it). A worker's chunk gets its own stack, which talks to Redis
    (worker/cluster/batches/middleware.py)."""
    hooks: list[ItemMiddleware] = [StopSignals(cancelled or threading.Event(), fail_fast, tolerance, total)]
    if emit is not None:
        hooks.append((ChunkProgress if per_chunk else ProgressEvents)(emit, node_id, total, done_before))
    return hooks


def tolerance_of(batch: BatchSpec) -> Tolerance:
    """The failure threshold of a batch block (`NO_THRESHOLD` when it sets none)."""
    return Tolerance(batch.tolerated_failure_percent, batch.tolerated_failure_count)


def tolerated_failures(tolerance: Tolerance, total: int) -> int:
    """The most failed items of a batch of `total` that `tolerance` accepts: the number the Lua script
    compares a batch's failure count with, found with the rule itself (`Tolerance.exceeded`)."""
    most = tolerance.count if tolerance.count is not None else total
    if tolerance.percent is not None:
        most = min(most, int(tolerance.percent * total / 100) + 1)
    while most > 0 and tolerance.exceeded(most, total):
        most -= 1
    while not tolerance.exceeded(most + 1, total):  # float rounding: at most a step or two
        most += 1
    return most


class StopSignals(ItemMiddleware):
    """In-process stops: the run was cancelled (Ctrl-C, a closed stream), or an item failed — fail_fast —
    or the batch's failed items exceed its failure threshold (of `total` items).

    One hook for all keeps the per-item cost of the default (fail_fast) batch to one cheap call, and `after_item`
    only for the items that failed. Its StopSignal (`stop`) reads the cancel flag too, so the items' waits end on
    either (worker/stopping.py).
    """

    every_item = False

    def __init__(
        self, cancelled: threading.Event, fail_fast: bool, tolerance: Tolerance = NO_THRESHOLD, total: int = 0
    ):
        self.cancelled, self.fail_fast, self.total = cancelled, fail_fast, total
        self.tolerance = tolerance if tolerance.set else None
        self.stop = stopping.StopSignal(also=cancelled)
        self.stopped = False  # a plain flag: set once, read by every thread of the batch
        self.failed = 0  # with a threshold: failed items so far (threads count under the lock)
        self.lock = threading.Lock()

    def before_item(self, index: int) -> bool:
        return not (self.stopped or self.stop.is_set())  # the stop reads the cancel flag and any outer loop's stop

    def after_item(self, outcome: ItemOutcome) -> None:
        if outcome.error is None:
            return
        if self.fail_fast:
            self.stopped = True
        elif self.tolerance is not None:
            with self.lock:
                self.failed += 1
                if self.tolerance.exceeded(self.failed, self.total):
                    self.stopped = True
        if self.stopped:
            self.stop.set()


class ProgressEvents(ItemMiddleware):
    """Emits one `batch_progress` event per finished item (thread-safe: parallel batches share it)."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], node_id: str, total: int, done_before: int = 0):
        self.emit, self.node_id, self.total = emit, node_id, total
        self.done = done_before
        self.lock = threading.Lock()

    def after_item(self, outcome: ItemOutcome) -> None:
        with self.lock:
            self.done += 1
            done = self.done
        self.emit(events.batch_progress(self.node_id, outcome.index, done, self.total, outcome.error is None))


class ChunkProgress(ProgressEvents):
    """`batch_progress` for a dataset job's records: one event per failed record as it fails, and one per chunk for
    the records that succeeded (`index` the last of them, `done` the count so far). The counts a display shows
    (done, failed) are those of an event per record; a million records make a few thousand events, not a million
    built for a display that keeps two numbers."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], node_id: str, total: int, done_before: int = 0):
        super().__init__(emit, node_id, total, done_before)
        self.succeeded: int | None = None  # the last record that succeeded since the last event, if any
        self.followed: ChunkResult | None = None  # a sequential loop's outcomes (`follow`): counted from there
        self.base = done_before  # `done` when the followed loop began

    def follow(self, chunk: ChunkResult) -> bool:
        with self.lock:
            self.followed, self.base = chunk, self.done
        return True

    def after_item(self, outcome: ItemOutcome) -> None:
        with self.lock:
            if self.followed is not None:  # only failed records come here: the others are counted at close
                self.done = self.base + len(self.followed.results)
            else:
                self.done += 1
            done = self.done
            if outcome.error is None:
                self.succeeded = outcome.index
                return
        self.emit(events.batch_progress(self.node_id, outcome.index, done, self.total, False))

    def close(self) -> None:
        with self.lock:
            if self.followed is not None:
                self.done = self.base + len(self.followed.results)
                self.succeeded = _last_success(self.followed)
                self.followed = None
            last, self.succeeded = self.succeeded, None
            done = self.done
        if last is not None:
            self.emit(events.batch_progress(self.node_id, last, done, self.total, True))


def _last_success(chunk: ChunkResult) -> int | None:
    """The highest index of `chunk` whose item succeeded, or None."""
    failed = {f.index for f in chunk.failures}
    index = chunk.start + len(chunk.results) - 1
    while index >= chunk.start and index in failed:
        index -= 1
    return index if index >= chunk.start else None
