"""Reading a dataset job, either backend: its store, its rows in input order (`results`), its progress (`status`)
and its result (`wait`). No engine, no IR models, no Celery: `chordflow results` and `wait` start without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from worker.batch.aggregate import ChunkResult
from worker.datasets import job as datasets
from worker.datasets.sqlite import LocalDataset
from worker.runs.record import FINAL, RESULT_STATUS, RunRecord, RunResult

if TYPE_CHECKING:
    from worker.cluster.datasets.store import ClusterDataset


def store_of(record: RunRecord) -> LocalDataset | ClusterDataset:
    return store_for(record.run_id, record.backend)


def store_for(run_id: str, backend: str) -> LocalDataset | ClusterDataset:
    """The store of a job on `backend`, which need not be recorded yet (`run --backend celery --out`)."""
    if backend == "local":
        return LocalDataset(run_id)
    from worker.cluster.datasets.store import ClusterDataset

    return ClusterDataset(run_id)


def rows(record: RunRecord, *, done_only: bool = False, is_final: Callable[[], bool]) -> Iterator[dict[str, Any]]:
    """`results` of a job: `{"index", "result", "error"}` per record in input order (see worker/datasets.rows)."""
    ds = store_of(record)
    return datasets.rows(ds, ds.chunk_size(), ended=is_final, done_only=done_only)


#: How often `follow_chunks` looks again for the next chunk while it is not finished.
FOLLOW_POLL_SECONDS = 0.05


def follow_chunks(
    ds: LocalDataset | ClusterDataset,
    ended: Callable[[], bool],
    pause: Callable[[float], Any] = time.sleep,
    done_only: bool = False,
) -> Iterator[tuple[ChunkResult | None, int, int]]:
    """A job's chunks in input order as (outcomes, start, length), each as soon as it and every chunk before it
    ended (looked for every FOLLOW_POLL_SECONDS, `pause` waiting); once `ended()` (the run is final: what it stored
    is all there is), the rest, a chunk that never ran with None (its records did not run). `done_only`: the
    chunks that ended so far, each as long as what it ran, then stop. What worker/datasets/job.py `rows` gives, a
    chunk at a time."""
    n, size = 0, 0
    while True:
        over = done_only or ended()  # before the store is read: what a run stored before it ended is seen
        ns = list(range(n, min(n + 8, ds.chunk_count())))
        if not ns and over:
            return
        for m, chunk in zip(ns, ds.outcomes(ns) if ns else [], strict=True):
            if chunk is None and not over:
                break
            size = size or ds.chunk_size()
            if not done_only:
                yield chunk, m * size, ds.chunk_length(m)
            elif chunk is not None:
                yield chunk, chunk.start, len(chunk.results)
            n = m + 1
        else:
            if ns:  # all read: there may be more at once
                continue
        pause(FOLLOW_POLL_SECONDS)


def progress(record: RunRecord) -> dict[str, Any]:
    """The `records` object of `status`: total, read, done, failed, rate (records/s), eta_s. A running cluster job
    whose records stopped coming in for longer than the dead-delivery bound (a worker died holding a chunk: it
    comes back after that bound) has no ETA (None) until they come in again."""
    now = record.updated if record.status in FINAL else time.time()
    ds = store_of(record)
    counts = datasets.progress(ds.counts(), record.created, now)
    if counts["eta_s"] is not None and record.status not in FINAL and record.backend != "local" and ds.stalled():
        counts["eta_s"] = None
    return counts


def result_of(record: RunRecord) -> RunResult:
    """A finished job's RunResult (for `wait`)."""
    counts = store_of(record).counts()
    return result(record.run_id, record.status, record.error, counts, record.updated - record.created)


def result(run_id: str, status: str, error: str | None, counts: dict[str, Any], duration: float) -> RunResult:
    """A job's RunResult: no store of its own; its outputs are the record counts (`results` has the rest)."""
    outputs = {k: counts[k] for k in ("total", "done", "failed")}
    return RunResult({}, RESULT_STATUS.get(status, status), error, outputs, run_id, duration)
