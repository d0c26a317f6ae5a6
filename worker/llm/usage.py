"""Where a run's model calls are recorded: the root list `__llm_calls__`, which every `llm` call appends to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The store key of the run's model calls.
CALLS = "__llm_calls__"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_totals(store: Mapping[str, Any]) -> dict[str, Any] | None:
    """{"calls", "cached_calls", "input_tokens", "output_tokens"}, "cost_usd" when any call was priced, and
    "batch_calls" and "saved_usd" when some were answered in provider batches (what the batch price saved), over the
    store's `__llm_calls__` (None without that list): what `chordflow status` and `results` report. Entries without
    counts add a call and no tokens; a reused answer (`cached`) is a call that billed nothing; an entry with `calls`
    stands for that many (worker/llm/usage.py `entries`)."""
    calls = store.get(CALLS)
    if not isinstance(calls, list):
        return None
    totals: dict[str, Any] = {"calls": 0, "cached_calls": 0, "input_tokens": 0, "output_tokens": 0}
    for entry in calls:
        many = _count(entry.get("calls")) if isinstance(entry, dict) else None  # a sum of calls (a dataset job's)
        totals["calls"] += 1 if many is None else many
        if isinstance(entry, dict):
            cached = entry.get("cached") is True if many is None else _count(entry.get("cached_calls")) or 0
            totals["cached_calls"] += cached
            for key in ("input_tokens", "output_tokens"):
                totals[key] += _count(entry.get(key)) or 0
            for money in ("cost_usd", "saved_usd"):
                if isinstance(usd := entry.get(money), int | float) and not isinstance(usd, bool):
                    totals[money] = totals.get(money, 0.0) + usd
            if entry.get("provider_batch") is True:
                totals["batch_calls"] = totals.get("batch_calls", 0) + 1
    return totals


def start_list(workflow: Any, store: dict[str, Any]) -> None:
    """A run of a workflow with `llm` nodes starts with its calls' list, so its batches' items append to it (a root
    list that exists before a batch is an accumulator; one made by the first item would be that item's alone)."""
    if any(node.type == "llm" for node in workflow.nodes):
        store.setdefault(CALLS, [])


#: What a sum of calls counts, per model (`summed`): a dataset job keeps these, not one entry per call.
SUMMED = ("calls", "cached_calls", "input_tokens", "output_tokens", "cost_micro_usd")


def summed(calls: Any) -> dict[str, dict[str, int]]:
    """Per model, the counts of `calls` (`__llm_calls__` entries) as whole numbers (USD in millionths), which a
    store adds up chunk by chunk: a million records' calls cost a few counters, not a million entries."""
    sums: dict[str, dict[str, int]] = {}
    for entry in calls if isinstance(calls, list) else ():
        if not isinstance(entry, dict):
            continue
        counts = sums.setdefault(str(entry.get("model") or "unknown"), dict.fromkeys(SUMMED, 0))
        counts["calls"] += 1
        counts["cached_calls"] += entry.get("cached") is True
        for name in ("input_tokens", "output_tokens"):
            counts[name] += entry.get(name) if isinstance(entry.get(name), int) else 0
        if isinstance(cost := entry.get("cost_usd"), int | float):
            counts["cost_micro_usd"] += round(cost * 1_000_000)
    return sums


def entries(sums: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """`summed` counts as `__llm_calls__` entries, one per model standing for its `calls` (what `status`, `top`, the
    dashboard and the metrics read); `cost_usd` only where some call was priced."""
    listed = []
    for model, counts in sorted(sums.items()):
        entry: dict[str, Any] = {"model": model, **{name: counts.get(name, 0) for name in SUMMED[:4]}}
        if counts.get("cost_micro_usd"):
            entry["cost_usd"] = counts["cost_micro_usd"] / 1_000_000
        listed.append(entry)
    return listed
