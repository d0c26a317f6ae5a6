"""Live batch progress of cluster runs, read from each run's progress stream (the one `wait` follows).

`LiveProgress` keeps, per followed run, its position in the stream and which items it has counted, so
each refresh reads only the entries written since the last one.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

#: The items/s rate is measured over this many seconds of a run's progress.
RATE_WINDOW_SECONDS = 10.0


@dataclass
class _Batch:
    """One dispatch of a batch node (`node#n`): the items counted so far, once each."""

    total: int
    seen: bytearray = field(default_factory=bytearray)
    done: int = 0
    failed: int = 0

    def count(self, index: int, ok: bool) -> None:
        if index >= len(self.seen):
            self.seen.extend(bytes(index + 1 - len(self.seen)))
        if not self.seen[index]:  # a redelivered chunk reports some items again
            self.seen[index] = 1
            self.done += 1
            self.failed += not ok


@dataclass
class _Followed:
    position: str = "0-0"
    batches: dict[str, _Batch] = field(default_factory=dict)
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LiveProgress:
    """Batch counts of cluster runs as their items finish, read from each run's progress stream.

    Only the entries written since the last read are read; the `keep` most recently followed runs are
    remembered (a run that ended keeps the counts it had, including those of a batch cut short).
    """

    #: Stream entries read per refresh at most (each holds several items' outcomes).
    MAX_ENTRIES = 20_000

    def __init__(self, keep: int = 256):
        self.keep = keep
        self._runs: OrderedDict[str, _Followed] = OrderedDict()
        self._lock = threading.Lock()

    def _followed(self, run_id: str) -> _Followed:
        with self._lock:
            followed = self._runs.pop(run_id, None) or _Followed()
            self._runs[run_id] = followed
            while len(self._runs) > self.keep:
                self._runs.popitem(last=False)
            return followed

    def read(self, run_id: str) -> tuple[dict[str, dict[str, int]], float | None]:
        """({node: {total, done, failed}} of each node's latest dispatch, items/s lately or None)."""
        from worker.cluster.state.runstate import RunState

        state = RunState(run_id)
        followed = self._followed(run_id)
        with followed.lock:
            read = 0
            while read < self.MAX_ENTRIES:
                followed.position, entries = state.read_progress(followed.position, 0)
                for batch, packed in entries:
                    if packed is None:  # the end of a batch, or of the run
                        continue
                    counted = followed.batches.setdefault(batch, _Batch(0))
                    counted.total = counted.total or state.batch_total(batch)
                    for index, ok in RunState.unpack_outcomes(packed):
                        counted.count(index, bool(ok))
                read += len(entries)
                if len(entries) < 1000:  # read_progress's count: fewer means the stream is read to its end
                    break
            latest: dict[str, tuple[int, _Batch]] = {}
            for key, batch in followed.batches.items():  # `node#<step>`: a node run again has a later step
                node, _, step = key.partition("#")
                number = int(match[0]) if (match := re.match(r"\d+", step)) else 0
                if node not in latest or number >= latest[node][0]:
                    latest[node] = (number, batch)
            done = sum(b.done for b in followed.batches.values())
            return {
                node: {"total": max(b.total, b.done), "done": b.done, "failed": b.failed}
                for node, (_, b) in latest.items()
            }, _rate(followed.samples, done)


def _rate(samples: deque[tuple[float, int]], done: int) -> float | None:
    """Items per second over the last RATE_WINDOW_SECONDS of samples (None until two are a moment apart)."""
    now = time.monotonic()
    samples.append((now, done))
    while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_SECONDS:
        samples.popleft()
    first_time, first_done = samples[0]
    return (done - first_done) / (now - first_time) if now - first_time >= 0.5 else None
