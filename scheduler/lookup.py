"""Find a run in whichever store recorded it: the embedded store first (local runs), then the cluster's Redis.

The one place that knows both stores exist; everything after a lookup speaks to the RunStore protocol
(worker/runs/store.py) and never asks which store it holds."""

from __future__ import annotations

import contextlib
from typing import Any

from ir.errors import BackendError, ValidationError
from worker import settings
from worker.runs.record import RunRecord
from worker.runs.sqlite import LocalRuns
from worker.runs.store import RunStore


class UnknownRun(ValidationError):
    """No store holds the run (the message says where it looked; `run_id` is the id asked for)."""

    def __init__(self, message: str, run_id: str = ""):
        super().__init__(message)
        self.run_id = run_id


def local_runs() -> LocalRuns:
    """The embedded store of this machine (CHORDFLOW_HOME)."""
    return LocalRuns.default()


def cluster_runs(signer: Any = None) -> RunStore:
    """The cluster's store; a clear BackendError when its Redis cannot be reached. `signer`: for a client that
    records workflows (submit, resume): each is signed with it (worker/cluster/state/runs.py)."""
    from scheduler.backends.celery import preflight  # Redis and Celery: only when a cluster run is asked for
    from worker.cluster.state.runs import ClusterRuns

    preflight(settings.load())
    return ClusterRuns(signer=signer)


def find_run(run_id: str, signer: Any = None) -> tuple[RunRecord, RunStore]:
    """(record, the store that holds it); a cluster store signs with `signer` what it records (`cluster_runs`)."""
    local = local_runs()
    record = local.get(run_id)
    if record is not None:
        return record, local
    runs = cluster_runs(signer)
    record = runs.get(run_id)
    if record is None:
        raise UnknownRun(
            f"unknown run '{run_id}' (not in {local.where} nor in Redis; finished runs expire, and a Redis restarted "
            "without persistence forgets its runs)",
            run_id,
        )
    return record, runs


def recent(status: str | None = None, limit: int = 20) -> list[RunRecord]:
    """Recent runs from both stores, newest first (the cluster's only when its Redis answers)."""
    records = local_runs().recent(status, limit)
    with contextlib.suppress(BackendError):
        records += cluster_runs().recent(status, limit)
    return sorted(records, key=lambda r: r.created, reverse=True)[:limit]
