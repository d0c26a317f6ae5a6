"""ItemMiddleware for distributed chunks: stop checks, batched progress, cluster-wide permits.

`batch` is the batch key (`<node id>#<dispatch id>`): a node that runs twice in one run (a loop) gets
a fresh abort flag, progress and permits each time.

Each talks to Redis at most every `interval` seconds or once per N items, never once per item.
"""

from __future__ import annotations

import time
import uuid

from worker.executor import ItemMiddleware
from worker.outcome import ItemOutcome
from worker.runstate import RunState


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
