"""The ItemMiddleware hung on the per-item loop, and `item_middleware`, the one place a stack is built.

In-process: StopSignals (cancel, fail_fast, failure threshold) and ProgressEvents. On a worker: StopCheck,
ConcurrencyPermit and ProgressPublisher, each talking to Redis at most every `interval` seconds or once per
N items, never once per item. `batch` is the batch key (`<node id>#<step>`): a node that runs twice in one
run (a loop) gets a fresh abort flag, progress, failure count and permits each time.

A failure threshold (`batch.tolerated_failure_percent` / `_count`) stops a batch once its failed items
exceed it. In-process, StopSignals counts them. On workers, ProgressPublisher adds each chunk's failure
count to the batch's in Redis in its batched writes, and the Lua script sets the batch's abort flag once
the sum passes the threshold; StopCheck, which polls that flag anyway, then stops every chunk (a chunk
whose own failures pass it stops at once). The verdict itself is taken on the merged outcomes
(`worker.engine.batch_node.judge_failures`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from ir.models import BatchSpec
from worker import events
from worker.batch.executor import ItemMiddleware
from worker.batch.outcome import ItemOutcome
from worker.batch.thresholds import Tolerance
from worker.cluster.state.runstate import RunState

#: A batch without a failure threshold.
NO_THRESHOLD = Tolerance()


def item_middleware(
    node_id: str,
    total: int,
    fail_fast: bool,
    *,
    cancelled: threading.Event | None = None,
    emit: Callable[[dict[str, Any]], None] | None = None,
    state: RunState | None = None,
    batch: str = "",
    max_concurrent: int | None = None,
    done_before: int = 0,
    tolerance: Tolerance = NO_THRESHOLD,
    chunk: int = 0,
) -> list[ItemMiddleware]:
    """The hooks around a batch's items, stops first: in-process (no `state`; `total`: the batch's items)
    or on a worker (`state`; `chunk`: the start of this chunk, `total`: its items)."""
    if state is None:
        hooks: list[ItemMiddleware] = [StopSignals(cancelled or threading.Event(), fail_fast, tolerance, total)]
        if emit is not None:
            hooks.append(ProgressEvents(emit, node_id, total, done_before))
        return hooks
    tolerated = None
    if tolerance.set:  # only a percentage needs the batch's total: one read per chunk
        tolerated = tolerated_failures(tolerance, state.batch_total(batch) if tolerance.percent is not None else 0)
    hooks = [StopCheck(state, batch, fail_fast, tolerated)]
    if max_concurrent:
        hooks.append(ConcurrencyPermit(state, batch, max_concurrent))
    hooks.append(ProgressPublisher(state, batch, chunk, tolerated))
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

    One hook for all keeps the per-item cost of the default (fail_fast) batch to two cheap calls.
    """

    def __init__(
        self, cancelled: threading.Event, fail_fast: bool, tolerance: Tolerance = NO_THRESHOLD, total: int = 0
    ):
        self.cancelled, self.fail_fast, self.total = cancelled, fail_fast, total
        self.tolerance = tolerance if tolerance.set else None
        self.stopped = False  # a plain flag: set once, read by every thread of the batch
        self.failed = 0  # with a threshold: failed items so far (threads count under the lock)
        self.lock = threading.Lock()

    def before_item(self, index: int) -> bool:
        return not (self.stopped or self.cancelled.is_set())

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


class StopCheck(ItemMiddleware):
    """Stops a chunk when the run is cancelled or its batch aborted: by a failed item under fail_fast, or
    by failures past the threshold (`tolerated` failed items at most; the flag is set in Redis by
    ProgressPublisher's script, or here when this chunk's own failures pass it)."""

    def __init__(
        self, state: RunState, batch: str, fail_fast: bool, tolerated: int | None = None, interval: float = 0.1
    ):
        self.state, self.batch, self.fail_fast, self.interval = state, batch, fail_fast, interval
        self.tolerated = tolerated
        self.failed = 0
        self.stopped = False
        self.next_check = 0.0

    def before_item(self, index: int) -> bool:
        if self.stopped:
            return False
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + self.interval
            self.stopped = self.state.should_stop(self.batch)
        return not self.stopped

    def after_item(self, outcome: ItemOutcome) -> None:
        if outcome.error is None:
            return
        self.failed += 1
        if self.fail_fast or (self.tolerated is not None and self.failed > self.tolerated):
            self.stopped = True
            self.state.abort(self.batch)


class ProgressPublisher(ItemMiddleware):
    """Buffers (index, ok) pairs and appends them to the run's stream in batches.

    With a failure threshold (`tolerated` not None) the same write reports this chunk's failure count
    (`chunk`: its start), and the script stops the batch once the batch's count passes `tolerated`.
    """

    def __init__(
        self,
        state: RunState,
        batch: str,
        chunk: int = 0,
        tolerated: int | None = None,
        interval: float = 0.25,
        max_buffer: int = 2000,
    ):
        self.state, self.batch, self.interval, self.max_buffer = state, batch, interval, max_buffer
        self.chunk, self.tolerated = chunk, tolerated
        self.failed = 0
        self.buffer: list[tuple[int, bool]] = []
        self.next_flush = time.monotonic() + interval

    def after_item(self, outcome: ItemOutcome) -> None:
        ok = outcome.error is None
        self.buffer.append((outcome.index, ok))
        if not ok:
            self.failed += 1
        if len(self.buffer) >= self.max_buffer or time.monotonic() >= self.next_flush:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            failures = None if self.tolerated is None else (self.chunk, self.failed, self.tolerated)
            self.state.publish(self.batch, self.buffer, failures)
            self.buffer = []
        self.next_flush = time.monotonic() + self.interval

    def close(self) -> None:
        self.flush()


class ConcurrencyPermit(ItemMiddleware):
    """`batch.max_concurrent` across the cluster: a chunk runs items only while it holds a permit.

    A chunk runs its items one at a time, so permits held == items in flight. The permit is a lease
    (renewed while running) so a killed worker's permit frees itself.
    """

    def __init__(self, state: RunState, batch: str, limit: int, lease: float = 30.0, poll: float = 0.05):
        self.state, self.batch, self.limit, self.lease, self.poll = state, batch, limit, lease, poll
        self.token = uuid.uuid4().hex
        self.renew_at = 0.0
        self.held = False

    def before_item(self, index: int) -> bool:
        now = time.monotonic()
        if self.held and now < self.renew_at:
            return True
        delay = self.poll
        while not self.state.acquire_permit(self.batch, self.token, self.limit, self.lease):
            if self.state.should_stop(self.batch):
                return False
            time.sleep(delay)  # waiting for another chunk to finish; nothing to subscribe to
            delay = min(delay * 2, 1.0)
        self.held = True
        self.renew_at = time.monotonic() + self.lease / 3
        return True

    def close(self) -> None:
        if self.held:
            self.state.release_permit(self.batch, self.token)
            self.held = False
