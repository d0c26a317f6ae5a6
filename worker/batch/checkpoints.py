"""Checkpoints of a local batch as it runs: a batch cut short (Ctrl-C, SIGTERM, a killed process, a failure
threshold) keeps the outcomes of the items that finished, so `resume` runs only the rest and `results --node`
lists them.

Written in chunks, not per item: every KEEP_SECONDS a writer thread hands the store the items finished since its
last write, from the first not yet kept on while they are contiguous, as one ChunkResult (one transaction). The
rest go when the loop ends, unless every item of the slice ran and succeeded: its outcomes then reach the store
in the batch's aggregate, at the step's checkpoint, with no second copy. A thread, not the item loop, keeps the
time: an item that runs for minutes does not hold back the outcomes before it. The cluster keeps its chunks'
outcomes in Redis instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemMiddleware
from worker.batch.outcome import ItemOutcome

#: At most this long between two writes of a running batch's outcomes (what a SIGKILL can lose).
KEEP_SECONDS = 0.5


class Checkpoints(ItemMiddleware):
    """Hands `keep` the outcomes of a slice's `count` items (from index `start`) in contiguous chunks, every
    KEEP_SECONDS and at the end. A sequential slice's loop lets them be read where it collects them (`follow`): no
    call per item. Thread-safe: a parallel slice finishes its items out of order; an item joins the chunk being
    built once those before it finished (until then it waits in `early`)."""

    def __init__(self, start: int, count: int, keep: Callable[[list[ChunkResult]], None]):
        self.keep, self.end = keep, start + count
        self.chunk = ChunkResult(start, [], [], {})  # contiguous outcomes not kept yet
        self.early: dict[int, ItemOutcome] = {}  # finished ahead of an item still running
        self.failures = 0
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.failed: Exception | None = None  # the writer's error (a full disk), raised again at close
        self.followed: ChunkResult | None = None  # a sequential loop's own outcomes (`follow`)
        self.taken = (0, 0)  # of `followed`: the results and failures written so far
        self.writer = threading.Thread(target=self._every, name="batch-checkpoints", daemon=True)
        self.writer.start()

    def after_item(self, outcome: ItemOutcome) -> None:
        if self.followed is not None:  # a failed item of a followed loop: read from its chunk
            return
        with self.lock:  # per item: the next one in order (always, in a sequential slice) goes straight in
            chunk = self.chunk
            if (
                outcome.error is None
                and not outcome.appended
                and not self.early
                and outcome.index == chunk.start + len(chunk.results)
            ):  # the usual item: its result, nothing else
                chunk.results.append(outcome.result)
                return
            if outcome.error is not None:
                self.failures += 1
            if outcome.index != self.chunk.start + len(self.chunk.results):
                self.early[outcome.index] = outcome
                return
            self._add(outcome)
            if self.early:
                while (follows := self.early.pop(self.chunk.start + len(self.chunk.results), None)) is not None:
                    self._add(follows)

    def follow(self, chunk: ChunkResult) -> bool:
        """A sequential slice: its outcomes are read where its loop collects them, no call per item."""
        with self.lock:
            self.followed = chunk
        return True

    def _add(self, outcome: ItemOutcome) -> None:
        chunk = self.chunk
        chunk.results.append(outcome.result)
        if outcome.error is not None:
            chunk.failures.append(outcome)
        if outcome.appended:
            for key, entries in outcome.appended.items():
                chunk.appended.setdefault(key, []).extend(entries)

    def close(self) -> None:
        self.closed.set()
        self.writer.join()
        at = self.followed or self.chunk
        failed = self.failures or (self.followed is not None and self.followed.failures)
        if failed or at.start + len(at.results) < self.end:  # cut short, or it may fail
            self._write()
        if self.failed is not None:
            raise self.failed

    def _every(self) -> None:
        while not self.closed.wait(KEEP_SECONDS):
            try:
                self._write()
            except Exception as exc:
                self.failed = exc
                return

    def _write(self) -> None:
        with self.lock:
            if self.followed is not None:
                done = self._news(self.followed)
            else:
                done = self.chunk
                self.chunk = ChunkResult(done.start + len(done.results), [], [], {})
        if done.results:
            self.keep([done])

    def _news(self, chunk: ChunkResult) -> ChunkResult:
        """What the followed chunk gained since the last write. Its length is read first: the loop adds a failed
        item's outcome before its result, so each failure below it is there already."""
        count = len(chunk.results)
        results_from, failures_from = self.taken
        end = chunk.start + count
        failures = []
        for failure in chunk.failures[failures_from:]:
            if failure.index >= end:
                break
            failures.append(failure)
        self.taken = (count, failures_from + len(failures))
        return ChunkResult(chunk.start + results_from, chunk.results[results_from:count], failures, {})
