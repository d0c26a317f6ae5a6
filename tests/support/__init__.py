"""Helpers shared by the test modules: workflow builders and wrapper-chain walking."""

from __future__ import annotations

import uuid
from typing import Any

import scheduler

AGGREGATE_KEYS = {"results", "count", "success_count", "error_count", "errors"}


def batch_node(
    node_id: str = "b",
    node_type: str = "test-upper",
    params: dict[str, Any] | None = None,
    items: str = "${x}",
    **batch: Any,
) -> dict[str, Any]:
    """A node IR dict with a `batch` block (`items` plus any other batch fields given)."""
    if params is None:
        params = {"text": "${item}"}
    return {"id": node_id, "type": node_type, "params": params, "batch": {"items": items, **batch}}


def workflow(*nodes: dict[str, Any], edges: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    wf: dict[str, Any] = {"ir_version": "0.1.0", "nodes": list(nodes)}
    if edges is not None:
        wf["edges"] = edges
    wf.update(extra)
    return wf


def run_in_process(wf: Any, shared: dict[str, Any]) -> dict[str, Any]:
    """Compile and run the PocketFlow flow directly in this process (no scheduler.run, no backend)."""
    flow = scheduler.compile(wf)
    flow.run(shared)
    return shared


def chain(node: Any) -> list[Any]:
    """The wrapper chain from `node` inward, following `.inner`."""
    out = [node]
    while hasattr(out[-1], "inner"):
        out.append(out[-1].inner)
    return out


def chain_names(node: Any) -> list[str]:
    return [type(n).__name__ for n in chain(node)]


def unique(prefix: str = "") -> str:
    """A run-unique string: keeps per-item counters in worker processes apart between tests."""
    return f"{prefix}{uuid.uuid4().hex[:10]}"
