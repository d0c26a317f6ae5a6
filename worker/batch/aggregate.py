"""The one merge of item outcomes into a batch result, used by the local loop and the cluster's merge task.

Outcomes travel per chunk in columnar form (ChunkResult): the results of a contiguous run of items as
one list, plus the few failed items in full. Merging chunks is then list concatenation in index
order, not one object per item.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from worker.batch.outcome import ItemOutcome


@dataclass(slots=True)
class ChunkResult:
    """Outcomes of items [start, start + len(results)), in index order."""

    start: int
    results: list[Any]
    failures: list[ItemOutcome]  # the failed items only, in index order
    appended: dict[str, list]  # accumulator entries of these items, in index order

    def to_wire(self) -> list[Any]:
        return [self.start, self.results, [f.to_wire() for f in self.failures], self.appended]

    @classmethod
    def from_wire(cls, data: list[Any]) -> ChunkResult:
        start, results, failures, appended = data
        return cls(start, results, [ItemOutcome.from_wire(f) for f in failures], appended)


@dataclass
class BatchResult:
    """What a batch hands back to `PflowBatchNode.post`: the aggregate, or the fail_fast failure, or —
    a batch stopped before every item ran (a failure threshold) — `stopped`: [items that ran, failed]."""

    aggregate: dict[str, Any] | None
    appended: dict[str, list] = field(default_factory=dict)  # accumulator entries, in index order
    failure: ItemOutcome | None = None
    stopped: list[int] | None = None

    @property
    def failed(self) -> int:
        """Failed items among the outcomes (those that ran)."""
        if self.stopped is not None:
            return self.stopped[1]
        return self.aggregate["error_count"] if self.aggregate else 0

    def to_wire(self) -> list[Any]:
        failure = self.failure.to_wire() if self.failure else None
        return [self.aggregate, self.appended, failure, self.stopped]

    @classmethod
    def from_wire(cls, data: list[Any]) -> BatchResult:
        aggregate, appended, failure, *stopped = data  # a result stored before `stopped` existed has 3 fields
        return cls(aggregate, appended, ItemOutcome.from_wire(failure) if failure else None, *stopped)


def merge(chunks: Iterable[ChunkResult], count: int, fail_fast: bool) -> BatchResult:
    """Chunks (any order; a redelivered chunk's duplicate is dropped) -> the batch's aggregate
    (docs/ARCHITECTURE.md, the batch contract).

    Items without an outcome (a batch stopped by its failure threshold) give no aggregate but `stopped`:
    whoever knows the threshold (`PflowBatchNode.post`) judges the outcomes that are there."""
    by_start: dict[int, ChunkResult] = {}
    for chunk in chunks:
        kept = by_start.get(chunk.start)
        if kept is None or len(chunk.results) > len(kept.results):
            by_start[chunk.start] = chunk
    ordered = [by_start[start] for start in sorted(by_start)]
    failures = [f for chunk in ordered for f in chunk.failures]
    if fail_fast and failures:
        return BatchResult(None, {}, min(failures, key=lambda f: f.index))
    if not _complete(ordered, count):
        return BatchResult(None, {}, stopped=[sum(len(chunk.results) for chunk in ordered), len(failures)])
    results: list[Any] = []
    appended: dict[str, list] = {}
    for chunk in ordered:
        results.extend(chunk.results)
        for key, entries in chunk.appended.items():
            appended.setdefault(key, []).extend(entries)
    errors = [_error_entry(f) for f in failures]
    aggregate = {
        "results": results,
        "count": count,
        "success_count": count - len(errors),
        "error_count": len(errors),
        "errors": errors or None,
    }
    return BatchResult(aggregate, appended)


def _complete(ordered: list[ChunkResult], count: int) -> bool:
    """Whether the chunks (by start) hold an outcome for every item 0..count-1, each once."""
    position = 0
    for chunk in ordered:
        if chunk.start != position:
            return False
        position += len(chunk.results)
    return position == count


def _error_entry(failure: ItemOutcome) -> dict[str, Any]:
    entry = {"index": failure.index, "item": failure.item, "error": failure.error}
    if failure.exception_type:
        entry["exception_type"] = failure.exception_type
    return entry


def merge_accumulators(shared: MutableMapping[str, Any], appended: dict[str, list]) -> None:
    """Extend the original accumulator lists (e.g. `__llm_calls__`) with the items' entries."""
    for key, entries in appended.items():
        target = shared.get(key)
        if isinstance(target, list):
            target.extend(entries)
