"""Where a run's model calls are recorded: the root list `__llm_calls__`, which every `llm` call appends to."""

from __future__ import annotations

from typing import Any

#: The store key of the run's model calls.
CALLS = "__llm_calls__"


def start_list(workflow: Any, store: dict[str, Any]) -> None:
    """A run of a workflow with `llm` nodes starts with its calls' list, so its batches' items append to it (a root
    list that exists before a batch is an accumulator; one made by the first item would be that item's alone)."""
    if any(node.type == "llm" for node in workflow.nodes):
        store.setdefault(CALLS, [])
