"""The one merge of item outcomes into the batch aggregate, used by the local and the chord backends."""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping
from typing import Any

from worker.outcome import ItemOutcome


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


def merge_accumulators(shared: MutableMapping[str, Any], ordered: Iterable[ItemOutcome]) -> None:
    """Append every item's accumulator entries (e.g. `__llm_calls__`) to the original lists, in index order."""
    for o in ordered:
        if o.appended:
            for key, entries in o.appended.items():
                target = shared.get(key)
                if isinstance(target, list):
                    target.extend(entries)
