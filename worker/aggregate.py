"""The one merge of item outcomes into a batch result, used by the local loop and the chord callback."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from worker.outcome import ItemOutcome


@dataclass
class BatchResult:
    """What a batch hands back to `PflowBatchNode.post`: the aggregate, or the fail_fast failure."""

    aggregate: dict[str, Any] | None
    appended: dict[str, list] = field(default_factory=dict)  # accumulator entries, in index order
    failure: ItemOutcome | None = None

    def to_wire(self) -> list[Any]:
        failure = self.failure.to_wire() if self.failure else None
        return [self.aggregate, self.appended, failure]

    @classmethod
    def from_wire(cls, data: list[Any]) -> BatchResult:
        aggregate, appended, failure = data
        return cls(aggregate, appended, ItemOutcome.from_wire(failure) if failure else None)


def order(outcomes: Iterable[ItemOutcome], count: int) -> list[ItemOutcome]:
    """Outcomes by index, exactly one per index (a redelivered chunk's duplicates are dropped)."""
    by_index: list[ItemOutcome | None] = [None] * count
    for outcome in outcomes:
        if by_index[outcome.index] is None:
            by_index[outcome.index] = outcome
    missing = [i for i, o in enumerate(by_index) if o is None]
    if missing:
        raise RuntimeError(f"batch incomplete: {len(missing)} of {count} items have no outcome (first: {missing[0]})")
    return by_index  # type: ignore[return-value]


def aggregate(ordered: list[ItemOutcome]) -> dict[str, Any]:
    """results / count / success_count / error_count / errors, in input order (DESIGN section 3)."""
    errors = []
    for o in ordered:
        if o.error is not None:
            entry = {"index": o.index, "item": o.item, "error": o.error}
            if o.exception_type:
                entry["exception_type"] = o.exception_type
            errors.append(entry)
    return {
        "results": [o.result for o in ordered],
        "count": len(ordered),
        "success_count": len(ordered) - len(errors),
        "error_count": len(errors),
        "errors": errors or None,
    }


def summarize(outcomes: Iterable[ItemOutcome], count: int, fail_fast: bool) -> BatchResult:
    outcomes = list(outcomes)
    if fail_fast:
        failed = [o for o in outcomes if o.error is not None]
        if failed:
            return BatchResult(None, {}, min(failed, key=lambda o: o.index))
    ordered = order(outcomes, count)
    appended: dict[str, list] = {}
    for o in ordered:
        if o.appended:
            for key, entries in o.appended.items():
                appended.setdefault(key, []).extend(entries)
    return BatchResult(aggregate(ordered), appended)


def merge_accumulators(shared: MutableMapping[str, Any], appended: dict[str, list]) -> None:
    """Extend the original accumulator lists (e.g. `__llm_calls__`) with the items' entries."""
    for key, entries in appended.items():
        target = shared.get(key)
        if isinstance(target, list):
            target.extend(entries)
