"""Limits of a running run changed by `chordflow update` (Step Functions' UpdateMapRun): `max_concurrent` and the
failure thresholds of its batches, and its priority (kept in the run record itself, not laid over batches).

A run keeps its workflow as submitted (signed); the changes live beside it (worker/cluster/state/keys.py
`overrides`) and are laid over every batch block of the workflow where it is read: by each advance (the verdict of
a batch, chunks dispatched from then on) and at the start of each chunk (its threads, permits and threshold). The
thresholds only apply to `continue` batches, as in the IR; `max_concurrent` to every batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ir.priorities import PRIORITIES

#: What `update` may change, with the type each is kept as.
LIMITS: dict[str, type] = {"max_concurrent": int, "tolerated_failure_percent": float, "tolerated_failure_count": int}


def problems(changes: Mapping[str, Any]) -> list[str]:
    """What is wrong with the changes asked for (empty: they can be applied), each one line naming the option."""
    found = []
    if not changes:
        found.append("nothing to change: give --max-concurrent, --tolerated-failure-percent, "
                     "--tolerated-failure-count, --priority, --budget-tokens or --budget-usd")  # fmt: skip
    value = changes.get("max_concurrent")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        found.append(f"max_concurrent must be an integer >= 1, got {value!r}")
    value = changes.get("tolerated_failure_percent")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 100):
        found.append(f"tolerated_failure_percent must be a number from 0 to 100, got {value!r}")
    value = changes.get("tolerated_failure_count")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        found.append(f"tolerated_failure_count must be an integer >= 0, got {value!r}")
    value = changes.get("priority")
    if value is not None and value not in PRIORITIES:
        found.append(f"priority must be one of {', '.join(PRIORITIES)}, got {value!r}")
    value = changes.get("budget_tokens")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        found.append(f"budget_tokens must be an integer >= 1, got {value!r}")
    value = changes.get("budget_usd")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value > 0):
        found.append(f"budget_usd must be a number > 0, got {value!r}")
    return found


def budget_only(changes: Mapping[str, Any]) -> bool:
    """Whether `changes` touch only the run's budget: the one change a run that ended may take (then `resume`)."""
    return bool(changes) and all(name.startswith("budget_") for name in changes)


def parse(raw: Mapping[bytes | str, bytes | str]) -> dict[str, Any]:
    """The overrides as Redis returns them (text) -> typed values."""
    found: dict[str, Any] = {}
    for name, value in raw.items():
        name = name.decode() if isinstance(name, bytes) else name
        value = value.decode() if isinstance(value, bytes) else value
        found[name] = LIMITS[name](value) if name in LIMITS else value
    return found


def apply_to_node(node: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A node's wire spec with the batch limits in `overrides` laid over its batch block (itself when none apply)."""
    batch = node.get("batch")
    if not batch or not overrides:
        return node
    changed = dict(batch)
    for name in LIMITS:
        if name in overrides and (name == "max_concurrent" or batch.get("error_handling") == "continue"):
            changed[name] = overrides[name]
    return {**node, "batch": changed}


def apply_to_workflow(workflow: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow's wire form with `apply_to_node` on each of its nodes (itself without overrides)."""
    if not overrides:
        return workflow
    return {**workflow, "nodes": [apply_to_node(node, overrides) for node in workflow.get("nodes", [])]}
