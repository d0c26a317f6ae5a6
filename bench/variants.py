"""The variants under test. Each `run_*` dispatches one batch of no-op items and waits for all results.

Every variant runs the same PocketFlow `NoopNode` once per item on `dict(shared)` plus the item, and
every Celery variant uses the same app (worker/app.py: msgpack, acks_late, prefetch 1), the same
redis-server and the same two workers.
"""

from __future__ import annotations

import math
from typing import Any

from celery import chord

import scheduler
from bench import raw_tasks
from worker.nodes.echo import NoopNode

WORKFLOW = {"nodes": [{"id": raw_tasks.NODE_ID, "type": "noop", "batch": {"items": "${items}"}}]}
RESULT_TIMEOUT = 900.0

NAIVE = "naive per-item chord"
CHUNKED = "hand-chunked chord"
CELERY = "chordflow celery"
LOCAL = "chordflow local"
VARIANTS = (NAIVE, CHUNKED, CELERY, LOCAL)
BODY_TASK = {NAIVE: "bench.collect", CHUNKED: "bench.concat", CELERY: "chordflow.aggregate"}


class WrongResult(AssertionError):
    pass


def _check(variant: str, count: int, results: list[Any], n: int) -> None:
    if count != n or len(results) != n:
        raise WrongResult(f"{variant}: expected {n} results, got count={count} len={len(results)}")


def item_shared(inputs: dict[str, Any]) -> dict[str, Any]:
    """What the raw baselines send with each task: the store without the batch's own item list.

    (chordflow's snapshot is the whole store, items included; that is its design, measured as is.)
    """
    return {k: v for k, v in inputs.items() if k != "items"}


def run_naive(items: list[Any], shared: dict[str, Any]) -> dict[str, Any]:
    """What a newcomer writes: one task per item, `chord(header)(callback).get()`."""
    result = chord([raw_tasks.naive_item.s(shared, item) for item in items])(raw_tasks.collect.s())
    value = result.get(timeout=RESULT_TIMEOUT)
    _check(NAIVE, value["count"], value["results"], len(items))
    return {"tasks": len(items)}


def chunk_count(processes: int, per_process: int = 4) -> int:
    return processes * per_process


def run_chunked(items: list[Any], shared: dict[str, Any], chunks: int) -> dict[str, Any]:
    """What an expert writes by hand: `chunks` slices (4 per worker process), ordered concatenation."""
    size = max(1, math.ceil(len(items) / chunks))
    header = [raw_tasks.chunk.s(shared, items[a : a + size]) for a in range(0, len(items), size)]
    value = chord(header)(raw_tasks.concat.s()).get(timeout=RESULT_TIMEOUT)
    _check(CHUNKED, value["count"], value["results"], len(items))
    return {"tasks": len(header), "chunk_size": size}


def run_chordflow(items: list[Any], backend: str, **extra_inputs: Any) -> dict[str, Any]:
    """chordflow's public API: scheduler.run(workflow, inputs, backend=...)."""
    result = scheduler.run(WORKFLOW, {"items": items, **extra_inputs}, backend=backend)
    aggregate = result.shared[raw_tasks.NODE_ID]
    if result.status != "success" or aggregate["success_count"] != len(items):
        raise WrongResult(f"chordflow {backend}: status={result.status} aggregate count={aggregate.get('count')}")
    _check(f"chordflow {backend}", aggregate["count"], aggregate["results"], len(items))
    return {}


def plain_loop(items: list[Any], shared: dict[str, Any]) -> None:
    """The floor for issue 2: the same NoopNode called per item with no engine around it."""
    node = NoopNode()
    for item in items:
        s = dict(shared)
        s["b"] = {}
        s["item"] = item
        node._run(s)
