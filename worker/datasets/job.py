"""Dataset jobs: a whole workflow run once per record of a file, in chunks of records.

A dataset job is a batch over a `workflow` node whose items are the records: each record is one isolated
instance of the workflow, run by the ONE per-item executor, and its result is the workflow's declared
outputs. Unlike a batch node, the records never sit in a store: the client reads the file in windows of
`chunk_size` records and stores each window as a chunk (embedded store or Redis); a chunk's outcomes
(worker/batch/aggregate.py ChunkResult) are stored beside it. So no process holds all records or all results.

This module holds what both backends share: the job's description (Dataset), the per-record node spec,
the rows of `results`, progress and the run's final verdict; running one chunk is chunks.py's. It imports
neither the engine nor the IR's models: `chordflow results` reads a job's rows through it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ir import snapshot
from worker.batch.aggregate import ChunkResult
from worker.batch.rows import Row, rows_of_chunks
from worker.batch.thresholds import Tolerance
from worker.llm import usage

if TYPE_CHECKING:
    from ir.models import NodeSpec

#: The per-record item alias, and the per-record node's id (also the batch key of the job's progress).
RECORD = "record"
RECORDS = "records"
#: Records per chunk of a large job unless `--chunk-size` says otherwise: large enough that a chunk's cost on a
#: worker (the task's delivery, claim, run record, outcomes and next send: 5-10 ms) is small next to its
#: records' (2,000 records of a two-node workflow: ~25 ms; bench/PROFILE_DATASETS.md: at 500 the workers spent a
#: third more CPU), small enough that `results --done` moves often and a chunk delivered again costs little.
DEFAULT_CHUNK_SIZE = 2000
#: A job expected to hold fewer records is cut into MIN_CHUNKS chunks (of SMALLEST_CHUNK records at least), so that
#: a small job of slow records (model calls) still spreads over the workers; one that cannot tell (an iterator of
#: records) gets SMALLEST_CHUNK.
MIN_CHUNKS = 32
SMALLEST_CHUNK = 500
#: `results` of a finished run: records that never ran (the run was cancelled or stopped by its threshold).
NOT_RUN = "not run: the run ended before this record ran (chordflow redrive RUN runs it)"
#: How often a reader of a running job (`results`, `wait --out`) looks again for a chunk not stored or finished yet.
POLL_SECONDS = 0.05


def default_chunk_size(expected: int | None) -> int:
    """Records per chunk when `--chunk-size` is not given, for a job of about `expected` records (None: unknown)."""
    if expected is None:
        return SMALLEST_CHUNK
    return max(SMALLEST_CHUNK, min(DEFAULT_CHUNK_SIZE, -(-expected // MIN_CHUNKS)))


@dataclass
class Dataset:
    """What a dataset job is, kept in its run record: how records become inputs, chunking, tolerance."""

    as_: str = RECORD  # the workflow input each record is given as; "-": the record's fields are the inputs
    chunk_size: int = DEFAULT_CHUNK_SIZE
    tolerated_failure_percent: float | None = None
    tolerated_failure_count: int | None = None
    source: str | None = None  # the records file, as the user named it
    inputs: list[str] = field(default_factory=list)  # inputs common to every record (in the run's store)

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(self.tolerated_failure_percent, self.tolerated_failure_count)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Dataset:
        return cls(**data)

    def record_spec(self, workflow: dict[str, Any]) -> NodeSpec:
        """The node one record runs: the workflow (inline IR) on a fresh store seeded from the record."""
        from ir.models import NodeSpec  # pydantic: only where a job runs, never where its rows are read

        if self.as_ == "-":
            inputs: Any = "${" + RECORD + "}"
        else:
            inputs = {**{name: "${" + name + "}" for name in self.inputs}, self.as_: "${" + RECORD + "}"}
        return NodeSpec.model_validate(
            {
                "id": RECORDS,
                "type": "workflow",
                "params": {"workflow": workflow, "inputs": inputs},
                "batch": {"items": "${" + RECORDS + "}", "as": RECORD, "error_handling": "continue"},
            }
        )


# -- a chunk's records ---------------------------------------------------------------------------------
def outcome_and_calls(chunk: ChunkResult) -> tuple[ChunkResult, dict[str, dict[str, int]]]:
    """What a store keeps of a finished chunk: its outcomes, without the entries its records appended to the store's
    lists, and the counts of their model calls (worker/llm/usage.py `summed`), which the store adds to the job's."""
    calls = usage.summed(chunk.appended.get(usage.CALLS))
    return ChunkResult(chunk.start, chunk.results, chunk.failures, {}), calls


def pack_records(records: Sequence[Any], bad: dict[int, str]) -> bytes:
    """A window of records as stored: the records (None where one was bad) and {offset: error} of the bad."""
    return snapshot.encode([list(records), bad], label="records")


def unpack_records(blob: bytes) -> tuple[list[Any], dict[int, str]]:
    records, bad = snapshot.decode(blob)
    return records, {int(k): v for k, v in bad.items()}


# -- what a dataset store offers, and what is built on it ------------------------------------------------
class DatasetStore(Protocol):
    """A dataset job's chunks and counts: the embedded store (local runs) or Redis (cluster runs)."""

    def chunk_count(self) -> int: ...

    def chunk_size(self) -> int: ...

    def chunk_length(self, n: int) -> int: ...

    def outcomes(self, ns: Sequence[int]) -> list[ChunkResult | None]: ...

    def counts(self) -> dict[str, Any]: ...

    def model_calls(self) -> dict[str, dict[str, int]]: ...


def follow_chunks(
    store: DatasetStore,
    ended: Callable[[], bool],
    pause: Callable[[float], Any] = time.sleep,
    done_only: bool = False,
) -> Iterator[tuple[ChunkResult | None, int, int]]:
    """A job's chunks in input order as (outcomes, start, length), a few read at a time, each as soon as it and every
    chunk before it ended (looked for every POLL_SECONDS, `pause` waiting); once `ended()` (the run is final: what it
    stored is all there is), the rest, a chunk that never ran with None (its records did not run). `done_only`: the
    chunks that ended so far, each as long as what it ran, then stop. `ended` is asked before the store is read: what
    a run stored before it ended is then always seen."""
    n, size = 0, 0
    while True:
        over = done_only or ended()
        ns = list(range(n, min(n + 8, store.chunk_count())))
        if not ns and over:
            return
        for m, chunk in zip(ns, store.outcomes(ns) if ns else [], strict=True):
            if chunk is None and not over:
                break
            size = size or store.chunk_size()
            if not done_only:
                yield chunk, m * size, store.chunk_length(m)
            elif chunk is not None:
                yield chunk, chunk.start, len(chunk.results)
            n = m + 1
        else:
            if ns:  # all read: there may be more at once
                continue
        pause(POLL_SECONDS)


def rows(store: DatasetStore, *, ended: Callable[[], bool], done_only: bool) -> Iterator[Row]:
    """`{"index", "result", "error"}` per record in input order (`follow_chunks`' chunks as rows): a record of a
    chunk that never ran, or that the run's end cut short, is NOT_RUN."""
    for chunk, start, length in follow_chunks(store, ended, done_only=done_only):
        first = start
        if chunk is not None:
            yield from rows_of_chunks([chunk])
            first = chunk.start + len(chunk.results)
        yield from _not_run(first, start + length)


def _not_run(start: int, stop: int) -> Iterator[Row]:
    return ({"index": i, "result": None, "error": NOT_RUN} for i in range(start, stop))


def verdict(
    dataset: Dataset, counts: dict[str, Any], cancelled: bool, store: DatasetStore | None = None
) -> tuple[str, str | None]:
    """(record status, error) of a dataset job that ended; when every record failed, the error its `store` holds
    most often follows (`...; most common error: 200 x TemplateError: ...`): the count alone says nothing."""
    if cancelled:
        return "cancelled", "run cancelled"
    if counts["total"] is None:
        where = dataset.source or "the records"
        return "failed", f"the client reading {where} stopped after {counts['read']} records: submit the job again"
    total = counts["total"]
    not_run = total - counts["done"]
    error = dataset.tolerance.verdict(counts["failed"], total)
    if not_run:  # stopped by the threshold (or a chunk was lost): say how many never ran
        error = f"{error} ({not_run} not run)" if error else f"{not_run} of {total} records did not run"
    if error and total and counts["failed"] == total and store is not None and (common := most_common_error(store)):
        error = f"{error}; most common error: {common}"
    return ("failed", error) if error else ("succeeded", None)


def most_common_error(store: DatasetStore) -> str | None:
    """`200 x TemplateError: ...`: the error most failed records have (the store read a few chunks at a time)."""
    seen: Counter[str] = Counter()
    count = store.chunk_count()
    for first in range(0, count, 8):
        for chunk in store.outcomes(list(range(first, min(first + 8, count)))):
            for failure in chunk.failures if chunk is not None else ():
                kind = failure.exception_type
                seen[f"{kind}: {failure.error}" if kind else str(failure.error)] += 1
    if not seen:
        return None
    error, times = seen.most_common(1)[0]
    return f"{times} x {error}"


def progress(counts: dict[str, Any], started: float, now: float) -> dict[str, Any]:
    """The `records` object of `status`: total (None until the file is read), read, done, failed, rate
    (records/s from `started` to `now`), eta_s."""
    elapsed = max(now - started, 1e-9)
    rate = counts["done"] / elapsed if counts["done"] else 0.0
    total = counts["total"]
    eta = (total - counts["done"]) / rate if rate and total is not None else None
    return {**counts, "rate": round(rate, 1), "eta_s": None if eta is None else round(eta, 1)}
