"""The ItemMiddleware of a chunk on a worker, each talking to Redis at most every `interval` seconds or once
per N items, never once per item: StopCheck, ConcurrencyPermit and ProgressPublisher.

`batch` is the batch key (`<node id>#<step>`): a node that runs twice in one run (a loop) gets a fresh
abort flag, progress, failure count and permits each time. A failure threshold works across chunks:
ProgressPublisher adds each chunk's failure count to the batch's in Redis in its batched writes, and the
Lua script sets the batch's abort flag once the sum passes the threshold; StopCheck, which polls that flag
anyway, then stops every chunk (a chunk whose own failures pass it stops at once).

A parallel batch's chunk runs its items on threads (worker/batch/executor.py run_parallel) with ONE stack of
these hooks: counters and buffers are under a lock, permits are held per thread, and TaskContext gives each
thread the Celery task the chunk runs in.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from typing import Any

from celery._state import _task_stack  # Celery's current-task stack: no public way to push onto it

from worker import stopping
from worker.batch.executor import ItemMiddleware
from worker.batch.middleware import tolerated_failures
from worker.batch.outcome import ItemOutcome
from worker.batch.thresholds import Tolerance
from worker.cluster.state.runstate import RunState
from worker.periodic import Periodic

log = logging.getLogger(__name__)


def chunk_middleware(
    state: RunState,
    batch: str,
    fail_fast: bool,
    *,
    chunk: int = 0,
    max_concurrent: int | None = None,
    tolerance: Tolerance | None = None,
    task: Any = None,
) -> list[ItemMiddleware]:
    """The hooks around a chunk's items on a worker, stops first (`chunk`: the start of this chunk; `task`: the
    Celery task running it, which item threads of a parallel chunk are given)."""
    tolerated = None
    if tolerance is not None and tolerance.set:  # only a percentage needs the batch's total: one read per chunk
        tolerated = tolerated_failures(tolerance, state.batch_total(batch) if tolerance.percent is not None else 0)
    hooks: list[ItemMiddleware] = [StopCheck(state, batch, fail_fast, tolerated)]
    if max_concurrent:
        hooks.append(ConcurrencyPermit(state, batch, max_concurrent, chunk))
    hooks.append(ProgressPublisher(state, batch, chunk, tolerated))
    if task is not None:
        hooks.append(TaskContext(task))
    return hooks


class StopCheck(ItemMiddleware):
    """Stops a chunk when the run is cancelled or its batch aborted: by a failed item under fail_fast, or
    by failures past the threshold (`tolerated` failed items at most; the flag is set in Redis by
    ProgressPublisher's script, or here when this chunk's own failures pass it).

    Between items it reads the flags at most every `interval`; items that are waiting (a rate limit, a backoff,
    a response) are told by the chunk's StopSignal (`stop`, worker/stopping.py), whose watcher reads the same
    flags every `watch` seconds while the chunk runs: one Redis read per chunk per poll, never per item."""

    every_item = False  # failed items only: they are what stops a batch

    def __init__(
        self,
        state: RunState,
        batch: str,
        fail_fast: bool,
        tolerated: int | None = None,
        interval: float = 0.1,
        watch: float = 0.5,
    ):
        self.state, self.batch, self.fail_fast, self.interval = state, batch, fail_fast, interval
        self.tolerated = tolerated
        self.failed = 0
        self.stop = stopping.StopSignal(poll=functools.partial(state.should_stop, batch), every=watch)
        self.next_check = 0.0
        self.lock = threading.Lock()

    def before_item(self, index: int) -> bool:
        if self.stop.event.is_set():  # the signal's own flag: nothing outside a worker's chunk sets it
            return False
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + self.interval
            if self.state.should_stop(self.batch):
                self.stop.set()
                return False
        return True

    def after_item(self, outcome: ItemOutcome) -> None:
        with self.lock:  # threads of a parallel chunk fail at once: count each, set the flag once
            self.failed += 1
            if self.stop.is_set() or not (
                self.fail_fast or (self.tolerated is not None and self.failed > self.tolerated)
            ):
                return
            self.stop.set()
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
        # One write at a time, under the lock: the failure count a write carries is never older than an earlier one's.
        self.lock = threading.Lock()

    def after_item(self, outcome: ItemOutcome) -> None:
        ok = outcome.error is None
        with self.lock:
            self.buffer.append((outcome.index, ok))
            if not ok:
                self.failed += 1
            if len(self.buffer) >= self.max_buffer or time.monotonic() >= self.next_flush:
                self._flush()

    def flush(self) -> None:
        with self.lock:
            self._flush()

    def _flush(self) -> None:
        if self.buffer:
            failures = None if self.tolerated is None else (self.chunk, self.failed, self.tolerated)
            self.state.publish(self.batch, self.buffer, failures)
            self.buffer = []
        self.next_flush = time.monotonic() + self.interval

    def close(self) -> None:
        self.flush()


#: Seconds a permit's lease lasts without renewal: how long a dead holder's permit (a SIGKILLed worker or pool
#: process, a host cut off) keeps its capacity from the batch.
PERMIT_LEASE = 6.0


class ConcurrencyPermit(ItemMiddleware):
    """`batch.max_concurrent` across the cluster: an item runs only while its thread holds a permit.

    Each thread running items (one in a sequential chunk, up to max_concurrent in a parallel one) takes its own
    permit (a token) before its first item and keeps it until it takes no more items (`leave_thread`) or the
    chunk ends, so items in flight <= permits held <= max_concurrent, whatever the chunks and threads.

    A permit is a lease of `lease` seconds, kept alive by a PermitKeeper thread for as long as this process lives,
    whatever an item's duration: a live holder's permit is never handed to another chunk, and a dead holder's
    comes back within one lease. A lowered limit (`chordflow update --max-concurrent`) takes permits back between
    items (each thread asks again every `refresh` seconds). Tokens are `<chunk start>/<delivery>/<n>`: the first
    permit a delivery of a chunk asks for takes back those of the chunk's earlier deliveries, so a chunk delivered
    again after its worker died gets their capacity at once instead of after their leases.
    """

    waits = True  # a thread may wait here for another chunk's permit: never under the parallel loop's lock

    def __init__(
        self,
        state: RunState,
        batch: str,
        limit: int,
        chunk: int,
        lease: float = PERMIT_LEASE,
        poll: float = 0.05,
        refresh: float = 1.0,
    ):
        self.state, self.batch, self.limit, self.lease, self.poll = state, batch, limit, lease, poll
        self.refresh = min(refresh, lease / 3)
        self.chunk = f"{chunk}/"
        self.delivery = f"{self.chunk}{uuid.uuid4().hex[:12]}/"
        self.reclaim: str | None = self.chunk  # until this delivery's first request
        self.tokens = itertools.count()
        self.held: dict[int, tuple[str, float]] = {}  # thread id -> (its token, when to ask again)
        self.lock = threading.Lock()
        self.keeper = PermitKeeper(self)

    def before_item(self, index: int) -> bool:
        me = threading.get_ident()
        with self.lock:
            held = self.held.get(me)
            reclaim, self.reclaim = self.reclaim, None
        if held is not None and time.monotonic() < held[1]:
            return True
        token = held[0] if held is not None else f"{self.delivery}{next(self.tokens)}"
        delay = self.poll
        while not self.state.acquire_permit(self.batch, token, self.limit, self.lease, reclaim):
            reclaim = None
            if self.state.should_stop(self.batch) or ((stop := stopping.current()) is not None and stop.is_set()):
                return False  # the run stopped, or this chunk did (its worker drains: worker/cluster/draining.py)
            time.sleep(delay)  # waiting for another chunk or thread to let go of one; nothing to subscribe to
            delay = min(delay * 2, 1.0)
        with self.lock:
            self.held[me] = (token, time.monotonic() + self.refresh)
        self.keeper.ensure_started()
        return True

    def keep(self) -> None:
        """Extend every held permit's lease; a thread whose permit was lost asks again before its next item."""
        with self.lock:
            tokens = [token for token, _ in self.held.values()]
        if not tokens:
            return
        lost = self.state.keep_permits(self.batch, tokens, self.limit, self.lease)
        if lost:
            with self.lock:
                for thread, (token, _) in list(self.held.items()):
                    if token in lost:
                        self.held[thread] = (token, 0.0)

    def leave_thread(self) -> None:
        with self.lock:
            held = self.held.pop(threading.get_ident(), None)
        if held is not None:
            self.state.release_permit(self.batch, held[0])

    def close(self) -> None:
        self.keeper.stop()
        with self.lock:
            tokens = [token for token, _ in self.held.values()]
            self.held.clear()
        for token in tokens:
            self.state.release_permit(self.batch, token)


class PermitKeeper(Periodic):
    """Renews a chunk's permits every third of their lease while the chunk runs: a long item (a model call, a
    429 backoff) keeps its permit, and a process that dies or stops stops renewing."""

    name = "chordflow-permits"

    def __init__(self, permits: ConcurrencyPermit):
        super().__init__(permits.lease / 3)
        self.permits = permits
        self.started = False
        self.lock = threading.Lock()

    def ensure_started(self) -> None:
        with self.lock:
            if not self.started:
                self.started = True
                self.start()

    def stop(self) -> None:
        with self.lock:
            if self.started:
                super().stop()

    def tick(self) -> None:
        try:
            self.permits.keep()
        except Exception as exc:  # Redis away for a moment, or slow: the next tick tries again, the thread lives on
            log.warning("could not renew the permits of batch %s: %s", self.permits.batch, exc)


class TaskContext(ItemMiddleware):
    """Item threads of a parallel chunk run as the chunk's Celery task: `celery.current_task` and its request
    (hostname, task id in log lines) are thread-local in Celery, so each thread is given the caller's."""

    def __init__(self, task: Any):
        self.task, self.request = task, task.request

    def enter_thread(self) -> None:
        _task_stack.push(self.task)
        self.task.request_stack.push(self.request)

    def leave_thread(self) -> None:
        self.task.request_stack.pop()
        _task_stack.pop()
