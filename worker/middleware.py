"""The ItemMiddleware hung on the per-item loop, and `item_middleware`, the one place a stack is built.

In-process: StopSignals (cancel, fail_fast) and ProgressEvents. On a worker: StopCheck, ConcurrencyPermit
and ProgressPublisher, each talking to Redis at most every `interval` seconds or once per N items, never
once per item. `batch` is the batch key (`<node id>#<step>`): a node that runs twice in one run (a loop)
gets a fresh abort flag, progress and permits each time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from worker import events
from worker.executor import ItemMiddleware
from worker.outcome import ItemOutcome
from worker.runstate import RunState


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
) -> list[ItemMiddleware]:
    """The hooks around a batch's items, stops first: in-process (no `state`) or on a worker (`state`)."""
    if state is None:
        hooks: list[ItemMiddleware] = [StopSignals(cancelled or threading.Event(), fail_fast)]
        if emit is not None:
            hooks.append(ProgressEvents(emit, node_id, total, done_before))
        return hooks
    hooks = [StopCheck(state, batch, fail_fast)]
    if max_concurrent:
        hooks.append(ConcurrencyPermit(state, batch, max_concurrent))
    hooks.append(ProgressPublisher(state, batch))
    return hooks


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
    """Stops a chunk when the run is cancelled or (fail_fast) another item of the batch failed."""

    def __init__(self, state: RunState, batch: str, fail_fast: bool, interval: float = 0.1):
        self.state, self.batch, self.fail_fast, self.interval = state, batch, fail_fast, interval
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
        if self.fail_fast and outcome.error is not None:
            self.stopped = True
            self.state.abort(self.batch)


class ProgressPublisher(ItemMiddleware):
    """Buffers (index, ok) pairs and appends them to the run's stream in batches."""

    def __init__(self, state: RunState, batch: str, interval: float = 0.25, max_buffer: int = 2000):
        self.state, self.batch, self.interval, self.max_buffer = state, batch, interval, max_buffer
        self.buffer: list[tuple[int, bool]] = []
        self.next_flush = time.monotonic() + interval

    def after_item(self, outcome: ItemOutcome) -> None:
        self.buffer.append((outcome.index, outcome.error is None))
        if len(self.buffer) >= self.max_buffer or time.monotonic() >= self.next_flush:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            self.state.publish(self.batch, self.buffer)
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
