"""Find a run in whichever store recorded it: the embedded store first (local runs), then the cluster's Redis.

The one place that knows both stores exist; everything after a lookup speaks to the RunStore protocol
(worker/runs/store.py) and never asks which store it holds."""

from __future__ import annotations

import contextlib

from ir.errors import BackendError, ValidationError
from worker import settings
from worker.runs.record import RunRecord
from worker.runs.sqlite import LocalRuns
from worker.runs.store import RunStore


def local_runs() -> LocalRuns:
    """The embedded store of this machine (CHORDFLOW_HOME)."""
    return LocalRuns.default()


def cluster_runs() -> RunStore:
    """The cluster's store; a clear BackendError when its Redis cannot be reached."""
    from scheduler.backends.celery import preflight  # Redis and Celery: only when a cluster run is asked for
    from worker.cluster.state.runs import ClusterRuns

    preflight(settings.load())
    return ClusterRuns()


def find_run(run_id: str) -> tuple[RunRecord, RunStore]:
    """(record, the store that holds it)."""
    local = local_runs()
    record = local.get(run_id)
    if record is not None:
        return record, local
    runs = cluster_runs()
    record = runs.get(run_id)
    if record is None:
        raise ValidationError(
            f"unknown run '{run_id}' (not in {local.where} nor in Redis; finished runs expire, and a Redis restarted "
            "without persistence forgets its runs)"
        )
    return record, runs


def recent(status: str | None = None, limit: int = 20) -> list[RunRecord]:
    """Recent runs from both stores, newest first (the cluster's only when its Redis answers)."""
    records = local_runs().recent(status, limit)
    with contextlib.suppress(BackendError):
        records += cluster_runs().recent(status, limit)
    return sorted(records, key=lambda r: r.created, reverse=True)[:limit]
