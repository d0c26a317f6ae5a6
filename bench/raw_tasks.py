"""Raw-Celery baselines, defined on chordflow's own Celery app (same broker, msgpack, acks_late, prefetch 1).

Workers import this module at start through CHORDFLOW_PLUGINS=bench.raw_tasks (worker/app.py connects
`registry.load_plugins` to `worker_init` / `worker_process_init`). Each task calls the same PocketFlow
`NoopNode` chordflow's `noop` type uses, on `dict(shared)` plus the item, exactly like a batch item.

- naive (what a newcomer writes): one `bench.naive_item` task per item, chord body `bench.collect`.
- hand-chunked (what an expert writes): one `bench.chunk` task per slice of items, chord body
  `bench.concat` joining the slices in order (the app sets `result_chord_ordered`).

The bench dispatches them by name from a stock Celery client with the same config (bench/variants.py).

Internal modules it uses beyond the public API: `worker.cluster.app`, `worker.nodes.echo`.
"""

from __future__ import annotations

from typing import Any

from worker.cluster.app import app
from worker.nodes.echo import NoopNode

NODE_ID = "b"
ALIAS = "item"
NAIVE_TASK, COLLECT_TASK, CHUNK_TASK, CONCAT_TASK = "bench.naive_item", "bench.collect", "bench.chunk", "bench.concat"
TASK_NAMES = (NAIVE_TASK, COLLECT_TASK, CHUNK_TASK, CONCAT_TASK)


def _one(node: NoopNode, shared: dict[str, Any], item: Any) -> Any:
    item_shared = dict(shared)
    item_shared[NODE_ID] = {}
    item_shared[ALIAS] = item
    node._run(item_shared)
    return item_shared[NODE_ID]


@app.task(name=NAIVE_TASK)
def naive_item(shared: dict[str, Any], item: Any) -> Any:
    """One item: a fresh NoopNode run on its own copy of the store; returns the node's namespace."""
    return _one(NoopNode(), shared, item)


@app.task(name=COLLECT_TASK)
def collect(results: list[Any]) -> dict[str, Any]:
    """Naive chord body: the per-item results (already in input order)."""
    return {"count": len(results), "results": results}


@app.task(name=CHUNK_TASK)
def chunk(shared: dict[str, Any], items: list[Any]) -> list[Any]:
    """A slice of items through one NoopNode instance; returns their namespaces in order."""
    node = NoopNode()
    return [_one(node, shared, item) for item in items]


@app.task(name=CONCAT_TASK)
def concat(chunks: list[list[Any]]) -> dict[str, Any]:
    """Hand-chunked chord body: the slices' results concatenated in chunk order."""
    results = [result for part in chunks for result in part]
    return {"count": len(results), "results": results}
