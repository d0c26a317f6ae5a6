"""What the dashboard's buttons do to a run: cancel, resume, redrive (the CLI's commands, by run id).

A local run resumed or redriven here goes on in a thread of the dashboard's process; its outcome is in
the run's record, which the page shows.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ir.errors import ValidationError
from scheduler import lookup
from worker.runs.record import FINAL


def cancel(run_id: str) -> str:
    from scheduler import durable

    revoked = durable.cancel_run(run_id)
    return f"cancel requested for run {run_id}" + (f": {revoked} chunks revoked" if revoked else "")


def resume(run_id: str) -> str:
    """A cluster run goes back to the workers; a local run goes on in this process (a thread of its own)."""
    import scheduler
    from scheduler import durable

    record, _ = lookup.find_run(run_id)
    if record.status not in ("failed", "cancelled"):
        raise ValidationError(f"run {run_id} is {record.status}; only a failed or cancelled run can be resumed")
    if record.dataset is not None:
        raise ValidationError(f"run {run_id} is a dataset job: redrive it")
    if record.backend == "celery":
        durable.resume_cluster(run_id)
        return f"run {run_id} resumed on the cluster"
    _in_background(lambda: scheduler.resume(run_id))
    return f"run {run_id} resumed in the dashboard's process"


def redrive(run_id: str) -> str:
    from scheduler.datasets import running

    record, _ = lookup.find_run(run_id)
    if record.backend == "celery":
        return f"run {run_id}: {running.redrive(run_id)} records to run again"
    if record.dataset is None or record.status not in FINAL:
        running.redrive(run_id)  # not redrivable: raises the ValidationError saying why, here, at once
    _in_background(lambda: running.redrive(run_id))
    return f"run {run_id}: redriven in the dashboard's process"


def _in_background(work: Callable[[], Any]) -> None:
    def run() -> None:
        with contextlib.suppress(Exception):  # the outcome is in the run's record, which the page shows
            work()

    threading.Thread(target=run, daemon=True, name="chordflow-dashboard-action").start()


ACTIONS: dict[str, Callable[[str], str]] = {"cancel": cancel, "resume": resume, "redrive": redrive}
