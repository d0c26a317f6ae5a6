"""The ItemMiddleware of a chunk on a worker, each talking to Redis at most every `interval` seconds or once
per N items, never once per item: StopCheck, ConcurrencyPermit and ProgressPublisher.

`batch` is the batch key (`<node id>#<step>`): a node that runs twice in one run (a loop) gets a fresh
abort flag, progress, failure count and permits each time. A failure threshold works across chunks:
ProgressPublisher adds each chunk's failure count to the batch's in Redis in its batched writes, and the
Lua script sets the batch's abort flag once the sum passes the threshold; StopCheck, which polls that flag
anyway, then stops every chunk (a chunk whose own failures pass it stops at once).
"""

from __future__ import annotations

import time
import uuid

from worker.batch.executor import ItemMiddleware
from worker.batch.middleware import tolerated_failures
from worker.batch.outcome import ItemOutcome
from worker.batch.thresholds import Tolerance
from worker.cluster.state.runstate import RunState


def chunk_middleware(
    state: RunState,
    batch: str,
    fail_fast: bool,
    *,
    chunk: int = 0,
    max_concurrent: int | None = None,
    tolerance: Tolerance | None = None,
) -> list[ItemMiddleware]:
    """The hooks around a chunk's items on a worker, stops first (`chunk`: the start of this chunk)."""
    tolerated = None
    if tolerance is not None and tolerance.set:  # only a percentage needs the batch's total: one read per chunk
        tolerated = tolerated_failures(tolerance, state.batch_total(batch) if tolerance.percent is not None else 0)
    hooks: list[ItemMiddleware] = [StopCheck(state, batch, fail_fast, tolerated)]
    if max_concurrent:
        hooks.append(ConcurrencyPermit(state, batch, max_concurrent))
    hooks.append(ProgressPublisher(state, batch, chunk, tolerated))
    return hooks


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
