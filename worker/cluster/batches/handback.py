"""A chunk's items handed back when its worker drains (worker/cluster/draining.py).

`Handback` is the chunk's hook: once told, it lets no item start, and splits the chunk in its window at the first
item not taken (`batch_window.lua` split): the chunk now ends there, and items [cut, end) are a chunk of their own,
claimed and sent at once, before this delivery acknowledges anything, so another worker begins them in seconds.
At the grace's end it sets the chunk's StopSignal: the items still waiting (a rate limit, a backoff, a response)
end without an outcome, and the chunk hands those back too as it ends (`settle`). One taken and running in code no
stop reaches keeps the process until the orchestrator kills it: its chunk, now [start, cut), is delivered again
after the dead-delivery bound, as any dead worker's.

Every step is safe twice: a split is fenced on the end its holder read (a second split of the same chunk, or one of
a chunk finished meanwhile, is 'gone'); the split-off chunk runs from the first of its messages to begin, as any
chunk (its finish, or a duplicate one, sends it again if this process died before sending it); a redelivery of the
chunk reads its shortened end (`BatchWindow.claimed`) and runs only that; and a finish whose outcome passes the
chunk's end (a stale delivery that ran past a split) is cut there (`finish`), so every index has one outcome.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery.exceptions import Reject

from ir import snapshot
from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemMiddleware
from worker.cluster.batches.dispatch import follow
from worker.cluster.state.windows import BatchWindow, WindowStep
from worker.stopping import StopSignal

log = logging.getLogger(__name__)


class Handback(ItemMiddleware):
    """The drain's hook on chunk `start` of `window`: `items` (decoded) made of blocks beginning at `starts`.

    Placed after the hooks that wait (permits): an item counts as taken once it may start."""

    def __init__(self, window: BatchWindow, start: int, items: list[Any], starts: list[int], stop: StopSignal):
        self.window, self.start, self.items, self.starts, self.stop = window, start, items, starts, stop
        self.end = start + len(items)
        self.next = start  # the first index no thread has taken
        self.drained = False
        self.timer: threading.Timer | None = None
        self.lock = threading.Lock()
        self.handing = threading.Lock()  # the drain's thread and the chunk's end hand back one at a time

    def before_item(self, index: int) -> bool:
        with self.lock:
            if self.drained:
                return False
            self.next = index + 1
            return True

    def drain(self, deadline: float) -> None:
        with self.lock:
            self.drained = True
            cut = self.next
        if cut == self.start:  # nothing in flight: the chunk ends now and is given back whole (`settle`)
            self.stop.set()
            return
        self.timer = threading.Timer(max(0.0, deadline - time.monotonic()), self.stop.set)
        self.timer.daemon = True
        self.timer.start()
        self.hand_back(cut)

    def hand_back(self, at: int) -> None:
        """Items [at, end) become a chunk of their own, sent now."""
        with self.handing:
            if at < self.end:
                self._split(at)

    def _split(self, at: int) -> None:
        block = None
        if at not in self.starts:  # mid-block: its items from `at` on are a block of their own
            following = min([s for s in self.starts if s > at] + [self.end])
            block = snapshot.encode(self.items[at - self.start : following - self.start], label=f"items[{at}:]")
        step = self.window.split(self.start, at, self.end, block)
        if step.state == "go":
            follow(self.window, step)
            log.info("draining: batch %s items[%d:%d] handed back", self.window.batch, at, self.end)
        self.end = at

    def settle(self, outcomes: ChunkResult) -> ChunkResult:
        """After the loop: a drained chunk that ran nothing is given back whole (Reject: requeued at once); one
        whose items the grace's stop ended before `end` hands them back."""
        if self.drained:
            ran = self.start + len(outcomes.results)
            if ran == self.start:
                raise Reject("the worker drains: the chunk goes back whole", requeue=True)
            self.hand_back(ran)
        return outcomes

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


def finish(window: BatchWindow, start: int, blob: bytes, count: int, seconds: float, size: int) -> WindowStep:
    """`window.finish` of a chunk's outcome; cut at the chunk's end when it was split meanwhile ('short')."""
    step = window.finish(start, blob, count, seconds, size, start + count)
    if step.state != "short" or step.end is None:
        return step
    chunk = ChunkResult.from_wire(snapshot.decode(blob))
    keep = step.end - start
    cut = ChunkResult(start, chunk.results[:keep], [f for f in chunk.failures if f.index < step.end], chunk.appended)
    return window.finish(start, snapshot.encode(cut.to_wire()), keep, seconds, size, step.end)
