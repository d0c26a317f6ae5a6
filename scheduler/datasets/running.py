"""Dataset jobs from the client's side, running them: read the records file in windows and run the job here
(`run_local`) or submit it to the cluster (`submit`), and `redrive` its failed records. Reading a job (rows,
progress, result) is reading.py's.

The cluster half (Celery, redis-py: ~0.15 s of imports) is imported by the functions that use it, so a local job's
`run --items` never loads it.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ir.errors import SameForEveryItem, ValidationError
from ir.limits import check_value
from ir.models import Budget
from ir.names import is_identifier
from scheduler.datasets import reading
from scheduler.inputs import unknown_input
from scheduler.lookup import cluster_runs, find_run, local_runs
from scheduler.records import BadRecord, Items, read_records, windows
from worker import settings
from worker.batch.aggregate import ChunkResult
from worker.batch.executor import ItemExecutor
from worker.batch.middleware import item_middleware
from worker.datasets import job as datasets
from worker.datasets.chunks import run_chunk
from worker.datasets.job import RECORD, RECORDS, Dataset, verdict
from worker.datasets.sqlite import LocalDataset
from worker.engine import context
from worker.engine.build import item_chain
from worker.engine.context import RunContext
from worker.engine.loader import load, source_of
from worker.llm import usage
from worker.llm.budget import local_budget
from worker.runs.record import FINAL, RunRecord, RunResult, new_run_id

if TYPE_CHECKING:
    pass

#: Bytes of a records file read to tell how many records it holds (`expected_records`).
SAMPLE_BYTES = 64 * 1024
#: `run_local`'s `on_chunk(outcomes, start, length)`: a chunk of `length` records from index `start` ran.
OnChunk = Callable[[ChunkResult | None, int, int], None]


def options(options: dict[str, Any]) -> dict[str, Any]:
    """`format=` (the Python name) is `fmt` inside; anything unknown is a TypeError as for any function."""
    known = {
        "as_", "format", "skip_bad_records", "tolerated_failure_percent", "tolerated_failure_count", "chunk_size",
        "max_record_bytes", "on_chunk",
    }  # fmt: skip
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(f"unexpected keyword arguments: {', '.join(unknown)}")
    options = dict(options)
    if "format" in options:
        options["fmt"] = options.pop("format")
    return options


def prepare(
    workflow: Any,
    inputs: dict[str, Any] | None,
    items: Items,
    *,
    backend: str,
    run_id: str | None = None,
    as_: str = RECORD,
    fmt: str | None = None,
    skip_bad_records: bool = False,
    tolerated_failure_percent: float | None = None,
    tolerated_failure_count: int | None = None,
    chunk_size: int | None = None,
    max_record_bytes: int | None = None,
) -> tuple[RunRecord, Dataset, dict[str, Any], Iterator[tuple[list, dict[int, str]]]]:
    """(the job's run record, not yet stored; its Dataset; the store of inputs common to every record; the
    record windows to read), all checked before anything is recorded: a file that cannot be read records no run.
    """
    common = dict(inputs or {})
    wf = load(workflow, [*common, *([as_] if as_ != "-" else [])])  # what each record is given is a known input
    problems = []
    if as_ != "-" and not is_identifier(as_):
        problems.append(f"--as: must be an input name or '-' (the record's fields are the inputs), got '{as_}'")
    elif as_ != "-" and (problem := unknown_input(wf, as_)):
        given = " (the default: each record is given as the input 'record')" if as_ == "record" else ""
        problems.append(f"--as{given}: {problem}")
    if as_ == "-" and common:
        problems.append("--input: with --as - every input comes from the record's fields")
    if as_ in common:
        problems.append(f"--input {as_}: '{as_}' is given by each record (--as {as_})")
    problems += [f"inputs: {p}" for name in common if (p := unknown_input(wf, name))]
    for name, value in common.items():
        with contextlib.suppress(ValidationError):
            check_value(value, f"inputs.{name}")
            continue
        problems.append(f"inputs.{name}: too deep to store")
    if tolerated_failure_percent is not None and not 0 <= tolerated_failure_percent <= 100:
        problems.append(f"--tolerated-failure-percent: must be between 0 and 100, got {tolerated_failure_percent:g}")
    if tolerated_failure_count is not None and tolerated_failure_count < 0:
        problems.append(f"--tolerated-failure-count: must be 0 or more, got {tolerated_failure_count}")
    if chunk_size is not None and chunk_size < 1:
        problems.append(f"--chunk-size: must be 1 or more, got {chunk_size}")
    size = chunk_size or datasets.default_chunk_size(expected_records(items))
    records: Iterable[Any] = ()
    try:
        cap = {} if max_record_bytes is None else {"max_record_bytes": max_record_bytes}
        records = read_records(items, fmt, skip_bad=skip_bad_records, **cap)  # a path: its format and opening checked
    except ValidationError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ValidationError(problems)
    source = str(items) if isinstance(items, str | Path) else None
    dataset = Dataset(as_, size, tolerated_failure_percent, tolerated_failure_count, source, list(common))
    usage.start_list(wf, common)  # the records' model calls are counted chunk by chunk (worker/datasets/job.py)
    status = "running" if backend == "local" else "queued"
    record = RunRecord(run_id or new_run_id(), wf.wire(), backend, status, None, source=source_of(workflow))
    record.dataset = dataset.to_json()
    return record, dataset, common, record_windows(records, size)


def expected_records(items: Items) -> int | None:
    """About how many records `items` holds, for the default chunk size: a collection's length; a file's size over
    the mean length of its first lines (SAMPLE_BYTES read); None when it cannot tell (an iterator, a pipe, a file
    that cannot be read, no line end in the sample)."""
    if not isinstance(items, str | os.PathLike):
        return len(items) if isinstance(items, Sized) else None
    try:
        if not stat.S_ISREG(os.stat(items).st_mode):
            return None  # a pipe (`--items /dev/stdin`): what a sample read would be gone for the reader
        with open(items, "rb") as f:
            sample, size = f.read(SAMPLE_BYTES), os.fstat(f.fileno()).st_size
    except OSError:
        return None  # read_records says why
    lines = sample.count(b"\n") + (len(sample) == size and not sample.endswith(b"\n"))
    return round(lines * size / len(sample)) if lines and sample else None


def wf_budget(record: RunRecord) -> Budget | None:
    """The caps on the job's model calls (its workflow's `budget`, the flags' laid over it)."""
    caps = record.workflow.get("budget")
    return None if caps is None else Budget.model_validate(caps)


def record_windows(records: Iterable[Any], size: int) -> Iterator[tuple[list, dict[int, str]]]:
    """The records in windows of `size`: (records with None where one was bad, {offset: why it was bad})."""
    for window in windows(records, size):
        if BadRecord not in map(type, window):  # most windows: one pass in C, none per record in Python
            yield window, {}
            continue
        bad = {i: r.error for i, r in enumerate(window) if isinstance(r, BadRecord)}
        yield [None if i in bad else r for i, r in enumerate(window)], bad


# -- the cluster ---------------------------------------------------------------------------------------
def submit(
    workflow: Any,
    inputs: dict[str, Any] | None,
    items: Items,
    *,
    run_id: str | None = None,
    priority: str | None = None,
    **options: Any,
) -> str:
    """Record the job in Redis, then read the records and store them chunk by chunk, sending chunks as the
    window allows; returns once the whole file is in Redis (the workers go on without this process).

    A submit that stops part-way (a bad record without `skip_bad_records`, Redis out of memory, Ctrl-C) deletes
    what it wrote and leaves the run's record alone, failed (cancelled) saying why; the error is raised here too."""
    from scheduler.reach import broker_errors
    from worker.cluster import signing
    from worker.cluster.app import current_app
    from worker.cluster.datasets.store import ClusterDataset
    from worker.cluster.datasets.tasks import go_on, send
    from worker.cluster.state import budget as budgets
    from worker.cluster.state.runstate import RunState

    record, dataset, common, chunks = prepare(workflow, inputs, items, backend="celery", run_id=run_id, **options)
    record.priority = priority or record.workflow.get("priority") or "normal"
    run_id = record.run_id
    with broker_errors(settings.load().result_backend):
        runs = cluster_runs(signing.publishing_signer(current_app()))  # preflight; the workflow is recorded signed
        ds, state = ClusterDataset(run_id), RunState(run_id)
        read = 0
        try:
            runs.create(record, common)
            budgets.record_caps(state, wf_budget(record))
            ds.start(dataset.chunk_size)
            for n, (records, bad) in enumerate(chunks):
                read += len(records)
                _, claimed = ds.add(n, records, bad, read)
                state.set_batch_total(RECORDS, read)
                send(run_id, claimed)
            go_on(run_id, *ds.read_done(read))
        except BaseException as exc:  # chunks already sent find nothing pending: they run no record
            with contextlib.suppress(Exception):  # a lost Redis cannot be told
                if isinstance(exc, KeyboardInterrupt):
                    runs.abandon(record, "cancelled", "run cancelled while its records were read")
                else:
                    why = str(exc) if isinstance(exc, ValidationError) else f"{type(exc).__name__}: {exc}"
                    runs.abandon(record, "failed", f"reading the records stopped: {why}")
            raise
    return run_id


def redrive(run_id: str, **hooks: Any) -> RunResult | int:
    """Run a finished job's failed records (and those never run) again, under the same run id; every
    success is kept and not run again. A local job runs here (returns its RunResult); a cluster job is
    handed to the workers (returns how many records will run)."""
    record, runs = find_run(run_id)
    _check_redrivable(record)
    if not runs.durable:
        return _redrive_local(record, **hooks)
    from scheduler.reach import broker_errors
    from worker.cluster.datasets.store import ClusterDataset
    from worker.cluster.datasets.tasks import go_on
    from worker.cluster.state.runstate import RunState

    with broker_errors(settings.load().result_backend):
        ds = ClusterDataset(run_id)
        if ds.counts()["total"] is None:
            raise ValidationError(f"run {run_id}: its records file was never read to the end; submit it again")
        RunState(run_id).clear_stops()
        records = ds.redrive()
        runs.set_status(run_id, "queued")
        go_on(run_id, *ds.check())
        return records


def _check_redrivable(record: RunRecord) -> None:
    if record.dataset is None:
        raise ValidationError(f"run {record.run_id} is not a dataset job (--items); use `chordflow resume`")
    if record.status not in FINAL:
        raise ValidationError(f"run {record.run_id} is {record.status}; only a finished run can be redriven")


# -- the embedded default -----------------------------------------------------------------------------
def run_local(
    workflow: Any,
    inputs: dict[str, Any] | None,
    items: Items,
    *,
    run_id: str | None = None,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    cancelled: threading.Event | None = None,
    on_chunk: OnChunk | None = None,
    **options: Any,
) -> RunResult:
    """Run the job in this process as the file is read, a window at a time; returns when it ended.

    `on_chunk(outcomes, start, length)`: called once each chunk ran, in input order (`run --out FILE`)."""
    started = time.perf_counter()
    record, dataset, common, chunks = prepare(workflow, inputs, items, backend="local", run_id=run_id, **options)
    runs = local_runs()
    runs.create(record, common)
    ds = LocalDataset(record.run_id, runs)
    ds.start(dataset.chunk_size)
    job = _LocalJob(record, dataset, common, ds, on_event, cancelled, on_chunk)
    read = 0
    try:
        for n, (records, bad) in enumerate(chunks):
            read += len(records)
            ds.add(n, records, bad, read)
            if not job.stopped():
                job.run(n, records, bad, None, read)
        ds.read_done(read)
    except BaseException as exc:
        why = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
        runs.set_status(record.run_id, why, "run cancelled" if why == "cancelled" else f"{type(exc).__name__}: {exc}")
        raise
    return job.end(started)


def _redrive_local(record: RunRecord, **hooks: Any) -> RunResult:
    started = time.perf_counter()
    runs = local_runs()
    dataset = Dataset.from_json(record.dataset or {})
    ds = LocalDataset(record.run_id, runs)
    ds.stop(None)
    runs.set_status(record.run_id, "running")
    job = _LocalJob(record, dataset, runs.load_store(record.run_id), ds, hooks.get("on_event"), hooks.get("cancelled"))
    read = ds.counts()["read"]  # a redrive reads no more records
    try:
        for n in ds.needing_work():
            if job.stopped():
                break
            records, bad = ds.records(n)
            job.run(n, records, bad, ds.outcomes([n])[0], read)
    except KeyboardInterrupt:
        runs.set_status(record.run_id, "cancelled", "run cancelled")
        raise
    return job.end(started)


class _LocalJob:
    """A local job's records running in this process: chunk by chunk, stopping on cancel or threshold."""

    def __init__(
        self,
        record: RunRecord,
        dataset: Dataset,
        common: dict[str, Any],
        ds: LocalDataset,
        on_event: Callable[[dict[str, Any]], None] | None,
        cancelled: threading.Event | None,
        on_chunk: OnChunk | None = None,
    ):
        self.record, self.dataset, self.ds, self.on_event, self.on_chunk = record, dataset, ds, on_event, on_chunk
        self.cancelled = cancelled or threading.Event()
        spec = dataset.record_spec(record.workflow)
        self.executor = ItemExecutor(spec, item_chain(spec), common)
        spent = usage.usage_totals({usage.CALLS: usage.entries(ds.model_calls())})  # a redrive counts past calls
        budget = local_budget(load(record.workflow), spent)
        self.refused: SameForEveryItem | None = None  # what stopped every record (a refused key, the budget)
        self.context = RunContext(answers=ds.runs.answers(record.run_id), budget=budget)

    def stopped(self) -> bool:
        if self.cancelled.is_set() or self.refused is not None:
            return True
        counts = self.ds.counts()
        if self.dataset.tolerance.set and self.dataset.tolerance.exceeded(counts["failed"], counts["total"]):
            self.ds.stop("threshold")
            return True
        return False

    def run(self, n: int, records: list[Any], bad: dict[int, str], done: Any, read: int) -> None:
        size = self.dataset.chunk_size
        before = self.ds.counts()["done"]

        def hooks(count: int) -> Any:
            return item_middleware(
                RECORDS, read, False, cancelled=self.cancelled, emit=self.on_event, done_before=before, per_chunk=True
            )

        try:
            with context.using(self.context):  # the records' model calls: answers kept in the run, its budget
                chunk = run_chunk(self.executor, records, bad, n * size, done, hooks)
        except SameForEveryItem as exc:  # every record would meet it: no more run; the file is still read (redrive)
            self.refused = exc
            return
        self.ds.finish(n, chunk, len(records))
        if self.on_chunk is not None:
            self.on_chunk(chunk, n * size, len(records))

    def end(self, started: float) -> RunResult:
        counts = self.ds.counts()
        status, error = verdict(self.dataset, counts, self.cancelled.is_set(), self.ds)
        if self.refused is not None and not self.cancelled.is_set():
            status, error = "failed", str(self.refused)
        local_runs().set_status(self.record.run_id, status, error)
        return reading.result(self.record.run_id, status, error, counts, time.perf_counter() - started)
