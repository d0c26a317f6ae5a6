"""The two Celery tasks of a distributed batch: `chordflow.run_chunk` (header) and
`chordflow.aggregate` (chord body). Chunks never raise for item failures; they return outcomes.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from ir import snapshot
from ir.models import NodeSpec
from worker.aggregate import ChunkResult, merge
from worker.app import app
from worker.batch import PflowBatchNode
from worker.build import batch_node
from worker.executor import ItemMiddleware, run_items
from worker.middleware import ConcurrencyPermit, ProgressPublisher, StopCheck
from worker.runstate import RunState

_CACHE_SIZE = 8
_nodes: OrderedDict[str, PflowBatchNode] = OrderedDict()
_snapshots: OrderedDict[str, dict[str, Any]] = OrderedDict()


def _remember(cache: OrderedDict, key: str, value: Any) -> Any:
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _node(spec: dict[str, Any]) -> PflowBatchNode:
    """A compiled batch node per spec, reused by every chunk of the batch on this process."""
    key = json.dumps(spec, sort_keys=True, default=str)
    node = _nodes.get(key)
    return node if node is not None else _remember(_nodes, key, batch_node(NodeSpec.model_validate(spec)))


def _snapshot(ref: bytes | dict[str, str], state: RunState) -> dict[str, Any]:
    """Inline bytes, or a content-hash reference fetched once per process."""
    if isinstance(ref, bytes):
        return snapshot.decode(ref)
    key = ref["ref"]
    cached = _snapshots.get(key)
    return cached if cached is not None else _remember(_snapshots, key, snapshot.decode(state.load_snapshot(key)))


@app.task(name="chordflow.run_chunk", bind=True)
def run_chunk(self: Any, job: dict[str, Any]) -> bytes:
    """Run items[start:start+len] of one batch node; return their outcomes (codec bytes)."""
    state = RunState(job["run"])
    node = _node(job["node"]).clone()  # its own instance: safe under any worker pool
    spec = node.batch
    batch = job["batch"]
    if state.should_stop(batch):
        return snapshot.encode(ChunkResult(job["start"], [], [], {}).to_wire())
    node.bind(_snapshot(job["snap"], state))
    items = snapshot.decode(job["items"])
    hooks: list[ItemMiddleware] = [StopCheck(state, batch, spec.error_handling == "fail_fast")]
    if spec.max_concurrent:
        hooks.append(ConcurrencyPermit(state, batch, spec.max_concurrent))
    hooks.append(ProgressPublisher(state, batch))
    chunk = run_items(node, items, job["start"], hooks)
    return snapshot.encode(chunk.to_wire(), label=f"batch '{node.node_id}' results")


@app.task(name="chordflow.aggregate")
def aggregate(chunk_results: list[bytes], job: dict[str, Any]) -> str:
    """Chord body: merge the chunks by index (the same merge as in-process), store the batch result
    in Redis and wake the scheduler."""
    chunks = [ChunkResult.from_wire(snapshot.decode(blob)) for blob in chunk_results]
    result = merge(chunks, job["count"], job["fail_fast"])
    blob = snapshot.encode(result.to_wire(), label=f"batch '{job['node']}' aggregate")
    RunState(job["run"]).finish_batch(job["batch"], blob)
    return "stored"
