"""A cluster run's batches as its progress stream tells them: items, those with an outcome, those that failed.

Workers append their items' outcomes to the run's stream (RunState.publish), many per entry; a reader counts
each index once (a redelivered chunk repeats some) and reads on from where it stopped. `chordflow top` and the
metrics keep one reader per run across snapshots; `status` reads a run's stream once (`batches_of`).
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from worker.cluster.state.keys import RunKeys
from worker.cluster.state.runstate import RunState

#: Stream entries one read asks for.
ENTRIES_PER_READ = 2000


@dataclass
class BatchProgress:
    """One batch of a run (a dataset job: its records): items, those with an outcome, those that failed."""

    node: str
    key: str  # `<node>#<step>`, the batch's key in run state
    total: int
    done: int = 0
    failed: int = 0
    finished: bool = False  # its merge task stored the merged result

    @property
    def ratio(self) -> float:
        return self.done / self.total if self.total else 0.0


class StreamProgress:
    """A running run's batches, read on from the stream position the last read stopped at."""

    def __init__(self) -> None:
        self.position = "0-0"
        self.batches: dict[str, BatchProgress] = {}
        self.seen: dict[str, bytearray] = {}

    def batch(self, key_: str, total: int) -> BatchProgress:
        found = self.batches.get(key_)
        if found is None:
            found = self.batches[key_] = BatchProgress(key_.split("#", 1)[0], key_, total)
            self.seen[key_] = bytearray(total)
        return found

    def read(self, entries: list[tuple[bytes, dict[bytes, bytes]]], totals: dict[str, int]) -> None:
        for entry_id, fields in entries:
            self.position = entry_id.decode()
            batch_key = fields.get(b"batch", b"").decode()
            if not batch_key or batch_key not in totals:
                continue  # the run's end marker, or a batch without a total (not one of a cluster run)
            progress = self.batch(batch_key, totals[batch_key])
            if b"done" in fields:
                progress.finished = True
            packed = fields.get(b"b")
            if packed is None:
                continue
            seen = self.seen[batch_key]
            for index, ok in RunState.unpack_outcomes(packed):
                if 0 <= index < len(seen) and not seen[index]:
                    seen[index] = 1
                    progress.done += 1
                    progress.failed += not ok


def batches_of(client: redis.Redis, run_id: str) -> list[BatchProgress]:
    """Every batch of the run its stream names, read to the end now."""
    progress, keys = StreamProgress(), RunKeys(run_id)
    while True:
        # the stream first: a batch's total is stored before its chunks are sent, so every batch the entries
        # read name has its total in the read after them
        reply = client.xread({keys.events: progress.position}, count=ENTRIES_PER_READ)
        totals = {k.decode(): int(v) for k, v in client.hgetall(keys.totals).items()}
        entries = [entry for _stream, part in reply or [] for entry in part]
        if not entries:
            return list(progress.batches.values())
        progress.read(entries, totals)
