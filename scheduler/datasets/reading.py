"""Reading a dataset job, either backend: its store, its rows in input order (`results`), its progress (`status`)
and its result (`wait`). No engine, no IR models, no Celery: `chordflow results` and `wait` start without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from worker.datasets import job as datasets
from worker.datasets.sqlite import LocalDataset
from worker.llm import usage
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
    """`results` of a job: `{"index", "result", "error"}` per record in input order (worker/datasets/job.py rows)."""
    return datasets.rows(store_of(record), ended=is_final, done_only=done_only)


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


def model_calls(record: RunRecord) -> list[dict[str, Any]]:
    """The job's model calls, one `__llm_calls__` entry per model standing for all its calls (worker/llm/usage.py)."""
    return usage.entries(store_of(record).model_calls())


def result_of(record: RunRecord) -> RunResult:
    """A finished job's RunResult (for `wait`)."""
    counts = store_of(record).counts()
    return result(record.run_id, record.status, record.error, counts, record.updated - record.created)


def result(run_id: str, status: str, error: str | None, counts: dict[str, Any], duration: float) -> RunResult:
    """A job's RunResult: no store of its own; its outputs are the record counts (`results` has the rest)."""
    outputs = {k: counts[k] for k in ("total", "done", "failed")}
    return RunResult({}, RESULT_STATUS.get(status, status), error, outputs, run_id, duration)
