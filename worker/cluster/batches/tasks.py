"""The two Celery tasks of a distributed batch: `chordflow.run_chunk` (one chunk, which hands out the next ones)
and `chordflow.aggregate` (the chord body's role: the merge). Chunks never raise for item failures; they record
outcomes.

Defined with `worker.app.task`: registered on every chordflow app, whatever settings it was built from. Neither
stores a Celery result (`ignore_result`): what they return is only their log line; outcomes go to the run's keys.
"""

from __future__ import annotations

import functools
import json
import time
from collections import OrderedDict
from typing import Any

from celery.exceptions import Ignore, Reject, Retry

from ir import snapshot
from ir.errors import RunPurged, SameForEveryItem
from ir.models import NodeSpec
from worker import redact, settings
from worker.batch import overrides
from worker.batch.aggregate import ChunkResult, merge
from worker.batch.executor import ItemExecutor, run_slice
from worker.batch.middleware import tolerance_of
from worker.cluster import logs, outage
from worker.cluster.app import task
from worker.cluster.batches import chunking
from worker.cluster.batches.dispatch import follow, send_advance, window_size
from worker.cluster.batches.middleware import chunk_middleware
from worker.cluster.batches.snapshot_cache import SnapshotCache
from worker.cluster.broker import deliveries
from worker.cluster.state import budget as budgets
from worker.cluster.state.answers import RedisAnswers
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.cluster.state.windows import BatchWindow
from worker.engine import context
from worker.engine.build import item_chain
from worker.engine.context import RunContext
from worker.engine.loader import checked_spec

_CACHE_SIZE = 8
_chains: OrderedDict[str, tuple[NodeSpec, Any]] = OrderedDict()


def _remember(cache: OrderedDict, key: str, value: Any) -> Any:
    cache[key] = value
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def chunk_executor(wire: dict[str, Any], shared: dict[str, Any]) -> ItemExecutor:
    """An executor over a per-item chain compiled once per spec on this process (cloned per chunk).

    The spec is checked as validation checks it before it is built (a bad one is an error naming the node)."""
    key = json.dumps(wire, sort_keys=True, default=str)
    compiled = _chains.get(key)
    if compiled is None:
        spec = checked_spec(wire)
        compiled = _remember(_chains, key, (spec, item_chain(spec)))
    spec, chain = compiled
    return ItemExecutor(spec, chain, shared).clone()  # its own instances: safe under any worker pool


def _snapshot(ref: bytes | dict[str, str], state: RunState) -> dict[str, Any]:
    """Inline bytes, or a content-hash reference fetched once per process (kept within a byte budget)."""
    if isinstance(ref, bytes):
        return snapshot.decode(ref)
    key = ref["ref"]
    return _snapshot_cache().get(key, lambda: state.load_snapshot(key), snapshot.decode)


@functools.cache
def _snapshot_cache() -> SnapshotCache:
    return SnapshotCache(settings.load().snapshot_cache_bytes)


@task(name="chordflow.run_chunk", bind=True, ignore_result=True)
def run_chunk(self: Any, job: dict[str, Any]) -> str:
    """Run items[start:start+len] of one batch node, record their outcomes in the batch's window and send the
    chunks its place in the window lets go (the merge, if this was the last one). Only one message of a chunk runs:
    the first to begin (another is a copy sent by aging, or one a redelivered advance sent again).

    Its worker renews its delivery while it lives, so a long chunk is not delivered again; fenced on the way out:
    a delivery taken over meanwhile (this worker paused past the bound) raises Ignore and records nothing, so the
    window counts the chunk once, from the delivery that holds it (worker/cluster/broker/deliveries.py). A
    delivery of a chunk already counted (its worker died after recording it) sends again what that finish
    claimed: the window never loses a chunk to a SIGKILL between its two steps."""
    began = time.monotonic()
    state = RunState(job["run"])
    window = BatchWindow(state, job["batch"], job["plan"])
    if not window.begin(job["start"], self.request.id or "called directly"):
        return "duplicate"  # another message of this chunk began first (a copy), or the batch was planned again
    payloads = job["items"] if "items" in job else window.chunk_items(job["blocks"])
    if payloads is None:  # a copy (worker/cluster/aging.py) of a chunk planned again since
        return "stale"
    try:
        with deliveries.held(self):
            blob, count = _run(self, job, payloads, state, began)
    except (*outage.ERRORS, Ignore, Reject, Retry):
        raise
    except Exception as exc:  # not an item failure (those are outcomes): the batch can never be merged
        _crashed(window, job, exc)
        raise
    if state.purged:  # seen by a stop check or a refused publish: the chunk stopped, and reports nothing
        raise RunPurged(f"run {job['run']} was purged: its chunk at {job['start']} stopped and reports nothing")
    processes = chunking.registered_processes(settings.load().result_backend) or chunking.FALLBACK_PROCESSES
    size = window_size(processes, window.open_windows())
    step = window.finish(job["start"], blob, count, time.monotonic() - began, size)
    if step.state == "purged":
        raise RunPurged(f"run {job['run']} was purged: its chunk at {job['start']} reports nothing")
    if step.state != "stale":
        follow(window, step)
    return step.state


def _run(task: Any, job: dict[str, Any], payloads: list[bytes], state: RunState, began: float) -> tuple[bytes, int]:
    """The chunk's outcomes (codec bytes) and how many items ran; `payloads`: its encoded blocks of items."""
    batch = job["batch"]
    stop, changed = state.chunk_start(batch)
    if stop:
        logs.chunk(job["run"], batch.split("#", 1)[0], batch, job["start"], 0, 0, time.monotonic() - began)
        return snapshot.encode(ChunkResult(job["start"], [], [], {}).to_wire()), 0
    # the batch's limits as `chordflow update` left them: threads, permits and threshold of this chunk
    executor = chunk_executor(overrides.apply_to_node(job["node"], changed), _snapshot(job["snap"], state))
    spec = executor.spec.batch
    assert spec is not None
    items = [item for payload in payloads for item in snapshot.decode(payload)]
    hooks = chunk_middleware(
        state, batch, spec.fail_fast, chunk=job["start"], max_concurrent=spec.max_concurrent,
        tolerance=tolerance_of(spec), task=task,
    )  # fmt: skip
    with context.using(RunContext(answers=RedisAnswers(state), budget=budgets.in_redis(state))):  # model calls
        chunk = run_slice(executor, items, job["start"], hooks)  # on threads with batch.parallel
    seconds = time.monotonic() - began
    logs.chunk(job["run"], executor.node_id, batch, job["start"], len(chunk.results), len(chunk.failures), seconds)
    return snapshot.encode(chunk.to_wire(), label=f"batch '{executor.node_id}' results"), len(chunk.results)


def _crashed(window: BatchWindow, job: dict[str, Any], exc: BaseException) -> None:
    """A chunk raised: a cluster run fails naming the cause; a client following the batch is told. (A chunk of a
    window that is gone, e.g. sent by hand, only raises.)"""
    window.state.abort(job["batch"])  # the batch can never be merged: its other chunks stop between items
    try:
        meta = window.header()["meta"]
    except LookupError:
        return
    cause = "" if isinstance(exc, SameForEveryItem) else "a chunk failed on a worker: "
    error = redact.mask(f"batch node '{meta['node']}': {cause}{exc}")
    window.crash(error)
    if "advance" in meta:
        batch_failed(meta, error)


@task(name="chordflow.aggregate", ignore_result=True)
def aggregate(job: dict[str, Any]) -> str:
    """The merge task, in the role of a chord's callback: once every chunk of the batch has finished (or stopped),
    merge their outcomes by index (the same merge as in-process), store the batch result in Redis and wake whoever
    goes on: the waiting scheduler (through the run's stream) or, for a run that lives in the cluster (`advance` in
    the job), the next `chordflow.advance`. Safe to run twice: a stored result is not merged again, only its advance
    sent again (the step fence drops a second one).

    A cluster run's chunk outcomes are kept per batch: `results --node` streams them, a batch cut short
    (cancelled) resumes with only the items that have no outcome, and one resumed merges them with its new chunks.
    A batch stopped by its failure threshold has items without an outcome too: merge reports it (`stopped`)
    and the batch node fails with the threshold's verdict.
    """
    run_id, batch = job["run"], job["batch"]
    state = RunState(run_id)
    window = BatchWindow(state, batch)
    if state.batch_result(batch) is None:
        if "snapshot" in job:  # every chunk has run: the batch's snapshot is needed no more
            state.drop_snapshot(job["snapshot"])
        chunk_results = window.outcomes()
        if "advance" in job:
            runs = ClusterRuns()
            cancelled = state.cancelled()  # first: RunPurged for a purged run, before anything is written
            chunks = runs.keep_chunks(run_id, batch, chunk_results)
            if cancelled:
                runs.set_status(run_id, "cancelled", "run cancelled", job["node"])
                logs.transition(run_id, "running", "cancelled", node=job["node"])
                window.drop()  # no longer a batch sharing the workers
                return "cancelled"
        else:
            chunks = [ChunkResult.from_wire(snapshot.decode(blob)) for blob in chunk_results]
        result = merge(chunks, job["count"], job["fail_fast"])
        blob = snapshot.encode(result.to_wire(), label=f"batch '{job['node']}' aggregate")
        state.finish_batch(batch, blob)
        window.drop()
    if "branch" in job:  # a batch inside a parallel branch: that branch's cursor goes on
        send_advance("chordflow.advance_branch", (run_id, *job["branch"], job["advance"]))
    elif "advance" in job:
        send_advance("chordflow.advance", (run_id, job["advance"]))
    return "stored"


def batch_failed(job: dict[str, Any], error: str) -> None:
    """A chunk of a cluster run's batch raised (not an item failure: e.g. a result that cannot travel back), so
    the batch will never be merged and no advance follows. Fail the run, naming the cause."""
    RunState(job["run"]).drop_snapshots()
    ClusterRuns().set_status(job["run"], "failed", error, job["node"])
    logs.transition(job["run"], "running", "failed", node=job["node"], error=error)
