"""What runs' model calls cost, as the dashboard, `top` and the metrics show it: `usage_totals`
(worker/llm/usage.py, what `status` and `results` print) over a run's `__llm_calls__` (a dataset job's: the sums its
chunks kept, `calls_of`), split by model for Prometheus, and counters by model that never go down.

A run's list is read again only when its record's `updated` changed (every checkpoint sets it), never once per
refresh or per scrape: a finished run's is read once.
"""

from __future__ import annotations

from typing import Any

from worker.llm.usage import CALLS, usage_totals
from worker.runs.record import RunRecord
from worker.runs.store import RunStore

#: The totals a counter is kept of (`cost_usd` only for models with a priced call).
FIELDS = ("calls", "cached_calls", "input_tokens", "output_tokens", "cost_usd")


def totals(calls: Any) -> dict[str, Any] | None:
    """`usage_totals` of a `__llm_calls__` value (None when the run has no such list)."""
    if not isinstance(calls, list):
        return None
    return usage_totals({CALLS: calls})


def calls_of(record: RunRecord, runs: RunStore) -> list[dict[str, Any]] | None:
    """A run's `__llm_calls__`; a dataset job's, one entry per model for the calls its records made (None without
    any)."""
    if record.dataset is None:
        return runs.load_key(record.run_id, CALLS)
    from scheduler.datasets import reading

    return reading.model_calls(record) or None


def by_model(calls: Any) -> dict[str, dict[str, Any]]:
    """`usage_totals` of each model's entries (an entry's `model`: the provider's name, or `fake`)."""
    groups: dict[str, list[Any]] = {}
    for entry in calls if isinstance(calls, list) else ():
        model = entry.get("model") if isinstance(entry, dict) else None
        groups.setdefault(str(model or "unknown"), []).append(entry)
    return {model: totals(entries) or {} for model, entries in groups.items()}


class ModelCounters:
    """Per model, the sum over runs of each run's highest totals seen: a counter (it only grows). A run that leaves
    Redis (its TTL, a purge) keeps what it added; a rewound one (repair, redrive) adds again only past its mark."""

    def __init__(self) -> None:
        self.totals: dict[str, dict[str, float]] = {}
        self._marks: dict[str, dict[str, dict[str, float]]] = {}  # run -> model -> field -> highest seen

    def see(self, run_id: str, usage: dict[str, dict[str, Any]]) -> None:
        """Count what a run's usage (`by_model`) adds to what it was seen at before."""
        marks = self._marks.setdefault(run_id, {})
        for model, counts in usage.items():
            mark, total = marks.setdefault(model, {}), self.totals.setdefault(model, {})
            for name in FIELDS:
                value = counts.get(name)
                if value is not None and value > mark.get(name, 0):
                    total[name] = total.get(name, 0) + value - mark.get(name, 0)
                    mark[name] = value
            for name in FIELDS[:4]:
                total.setdefault(name, 0)

    def forget(self, run_id: str) -> None:
        """A run gone from Redis: what it added stays counted, its marks are needed no more."""
        self._marks.pop(run_id, None)
