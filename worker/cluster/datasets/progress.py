"""The hooks around a cluster dataset chunk's records (`record_hooks`): its stop check and its progress on the run's
stream, as one middleware that builds nothing per record.

A batch chunk's ProgressPublisher (worker/cluster/batches/middleware.py) is told of every item and buffers an
(index, ok) pair per item; a record costs ~1 us that way, a tenth of a two-node record. A dataset chunk has no
failure threshold to report per write (its tolerance is judged at the job's end, from the chunks' counts), so
its progress is read off the loop's own ChunkResult instead (`ItemMiddleware.follow`): between records, when the
stop check reads the clock anyway, and at the end. The stream gets the same pairs, at most every PUBLISH_EVERY.
"""

from __future__ import annotations

import time

from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemMiddleware
from worker.batch.outcome import ItemOutcome
from worker.cluster.batches.middleware import StopCheck
from worker.cluster.state.runstate import RunState

#: Seconds between two progress writes of a chunk (a batch chunk's ProgressPublisher's interval).
PUBLISH_EVERY = 0.25


class RecordHooks(StopCheck):
    """StopCheck (the cancel flag and the job's abort flag, read every `interval` between records) that also
    publishes the records that ended since its last write, when it follows the loop's ChunkResult; when it may not
    (records that append to the store's lists: the loop offers no ChunkResult then), it is told of each record."""

    def __init__(self, state: RunState, batch: str):
        super().__init__(state, batch, fail_fast=False)
        self.chunk: ChunkResult | None = None
        self.sent = 0  # records of `chunk` published
        self.failed_at: set[int] = set()  # indexes of the failed records not yet published
        self.pairs: list[tuple[int, bool]] = []  # told of each record (not following): what is not yet published
        self.next_publish = time.monotonic() + PUBLISH_EVERY

    def follow(self, chunk: ChunkResult) -> bool:
        self.chunk = chunk
        return True

    def before_item(self, index: int) -> bool:
        if self.stop.event.is_set():
            return False
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + self.interval
            if now >= self.next_publish:
                self.publish(now)
            if self.state.should_stop(self.batch):
                self.stop.set()
                return False
        return True

    every_item = True  # when it does not follow: a pair per record; following, the loop calls it for failed ones

    def after_item(self, outcome: ItemOutcome) -> None:
        if self.chunk is None:
            self.pairs.append((outcome.index, outcome.error is None))
        if outcome.error is not None:
            super().after_item(outcome)

    def publish(self, now: float | None = None) -> None:
        self.next_publish = (now or time.monotonic()) + PUBLISH_EVERY
        pairs = self._ended()
        if pairs:
            self.state.publish(self.batch, pairs)

    def _ended(self) -> list[tuple[int, bool]]:
        """The (index, ok) of each record that ended since the last write: the loop appends a failed record to
        `failures` before its result, so the failures below the length of `results` read first are all there."""
        chunk = self.chunk
        if chunk is None:
            pairs, self.pairs = self.pairs, []
            return pairs
        ended = len(chunk.results)
        first, start = chunk.start + self.sent, chunk.start
        failed = {f.index for f in chunk.failures if f.index >= first}
        self.sent = ended
        return [(index, index not in failed) for index in range(first, start + ended)]

    def close(self) -> None:
        self.publish()


def record_hooks(state: RunState, batch: str) -> list[ItemMiddleware]:
    return [RecordHooks(state, batch)]
