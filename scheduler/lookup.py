"""Find a run in whichever store recorded it: the embedded store first (local runs), then the cluster's Redis.

The one place that knows both stores exist; everything after a lookup speaks to the RunStore protocol
(worker/runs/store.py) and never asks which store it holds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ir.errors import AmbiguousRunId, BackendError, UnknownRun
from worker import settings
from worker.runs.record import RunRecord
from worker.runs.sqlite import LocalRuns
from worker.runs.store import RunStore

__all__ = ["AmbiguousRunId", "UnknownRun", "cluster_runs", "find_run", "full_run_id", "local_runs", "recent"]

#: A run id given on the command line may be cut to this many characters, if no other run's id starts the same.
MIN_PREFIX = 4
#: Runs named in the error of an ambiguous prefix.
MAX_SHOWN_MATCHES = 10


def local_runs() -> LocalRuns:
    """The embedded store of this machine (CHORDFLOW_HOME)."""
    return LocalRuns.default()


def cluster_runs(signer: Any = None) -> RunStore:
    """The cluster's store; a clear BackendError when its Redis cannot be reached. `signer`: for a client that
    records workflows (submit, resume): each is signed with it (worker/cluster/state/runs.py)."""
    from scheduler.reach import preflight  # Redis: only when a cluster run is asked for
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


def full_run_id(run_id: str) -> str:
    """The whole id of the one run whose id starts with `run_id` (at least MIN_PREFIX characters), else `run_id`
    as given (an unknown run is named by whoever looks it up); AmbiguousRunId when several runs' ids start so.

    An exact id is taken as it is; the cluster is asked only when its Redis answers."""
    local = local_runs()
    if len(run_id) < MIN_PREFIX or local.get(run_id) is not None:
        return run_id
    matches = set(local.ids_starting(run_id, MAX_SHOWN_MATCHES + 1))
    with contextlib.suppress(BackendError):
        cluster = cluster_runs()
        if cluster.get(run_id) is not None:
            return run_id
        matches.update(cluster.ids_starting(run_id, MAX_SHOWN_MATCHES + 1))
    if len(matches) > 1:
        shown = sorted(matches)[:MAX_SHOWN_MATCHES]
        more = ", ..." if len(matches) > MAX_SHOWN_MATCHES else ""
        raise AmbiguousRunId(
            f"run id prefix '{run_id}' matches {len(matches) if not more else 'more than ' + str(MAX_SHOWN_MATCHES)} "
            f"runs: {', '.join(shown)}{more} (give more characters)",
            run_id,
        )
    return matches.pop() if matches else run_id


def recent(
    status: str | None = None, limit: int = 20, unreachable: Callable[[BackendError], None] | None = None
) -> list[RunRecord]:
    """Recent runs from both stores, newest first (the cluster's only when its Redis answers: else `unreachable`
    is told why, for `chordflow runs` to say the list is the local runs only)."""
    records = local_runs().recent(status, limit)
    try:
        records += cluster_runs().recent(status, limit)
    except BackendError as exc:
        if unreachable is not None:
            unreachable(exc)
    return sorted(records, key=lambda r: r.created, reverse=True)[:limit]
