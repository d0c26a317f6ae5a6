"""The two Celery tasks of a distributed batch: `chordflow.run_chunk` (one chunk, which hands out the next ones)
and `chordflow.aggregate` (the merge). Chunks never raise for item failures; they record
outcomes.

Defined with `worker.app.task`: registered on every chordflow app, whatever settings it was built from. Neither
stores a Celery result (`ignore_result`): what they return is only their log line; outcomes go to the run's keys.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections import OrderedDict
from typing import Any

from celery.exceptions import Ignore, Reject, Retry

from ir import snapshot
from ir.errors import RunPurged, SameForEveryItem
from ir.models import NodeSpec
from worker import redact, settings, tracing
from worker.batch import overrides
from worker.batch.aggregate import ChunkResult
from worker.batch.aggregate import merge as merge_outcomes
from worker.batch.executor import ItemExecutor, run_slice, stop_of
from worker.batch.middleware import tolerance_of
from worker.cluster import draining, logs, outage
from worker.cluster.app import task
from worker.cluster.batches import chunking, handback
from worker.cluster.batches.dispatch import follow, send_advance, window_size
from worker.cluster.batches.middleware import chunk_middleware
from worker.cluster.batches.snapshot_cache import SnapshotCache
from worker.cluster.broker import deliveries
from worker.cluster.messages import MERGE, RUN_CHUNK, Chunk, Header, Merge
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


@task(name=RUN_CHUNK, bind=True, ignore_result=True)
def run_chunk(self: Any, message: dict[str, Any]) -> str:
    """Run items[start:start+len] of one batch node, record their outcomes in the batch's window and send the
    chunks its place in the window lets go (the merge, if this was the last one). Only one message of a chunk runs:
    the first to begin (another is a copy sent by aging, or one a redelivered advance sent again).

    Its worker renews its delivery while it lives, so a long chunk is not delivered again; fenced on the way out:
    a delivery taken over meanwhile (this worker paused past the bound) raises Ignore and records nothing, so the
    window counts the chunk once, from the delivery that holds it (worker/cluster/broker/deliveries.py). A
    delivery of a chunk already counted (its worker died after recording it) sends again what that finish
    claimed: the window never loses a chunk to a SIGKILL between its two steps.

    Its worker draining (worker/cluster/draining.py), it hands back its items not started (handback.py); one that
    begins then goes back whole."""
    if draining.began():
        raise Reject("the worker drains: handed back before it began", requeue=True)
    chunk = Chunk.from_wire(message)
    began = time.monotonic()
    state = RunState(chunk.run)
    window = BatchWindow(state, chunk.batch, chunk.plan)
    if not window.begin(chunk.start, self.request.id or "called directly"):
        return "duplicate"  # another message of this chunk began first (a copy), or the batch was planned again
    held = window.claimed(chunk.start)  # shortened if a drain split it; None once finished (a duplicate's outcome)
    blocks = held.blocks if held is not None else chunk.blocks or []
    payloads = chunk.items if chunk.items is not None else window.chunk_items(blocks)
    if payloads is None:  # a copy (worker/cluster/aging.py) of a chunk planned again since
        return "stale"
    try:
        with (
            tracing.within(chunk.run, tracing.parent_of(chunk.trace)),
            tracing.span(
                f"chunk {chunk.batch.split('#', 1)[0]}", _delivery(self, chunk, window), quiet=QUIET
            ) as current,
            deliveries.held(self),  # inside the span: a delivery fenced on the way out is named on it
        ):
            blob, count = _run(self, chunk, payloads, state, began, held.end if held is not None else None)
            if current is not None:
                current.set_attribute("chordflow.items", count)
    except (*outage.ERRORS, Ignore, Reject, Retry):
        raise
    except Exception as exc:  # not an item failure (those are outcomes): the batch can never be merged
        _crashed(window, chunk, exc)
        raise
    if state.purged:  # seen by a stop check or a refused publish: the chunk stopped, and reports nothing
        raise RunPurged(f"run {chunk.run} was purged: its chunk at {chunk.start} stopped and reports nothing")
    processes = chunking.registered_processes(settings.load().result_backend) or chunking.FALLBACK_PROCESSES
    size = window_size(processes, window.open_windows())
    step = handback.finish(window, chunk.start, blob, count, time.monotonic() - began, size)
    if step.state == "purged":
        raise RunPurged(f"run {chunk.run} was purged: its chunk at {chunk.start} reports nothing")
    if step.state != "stale":
        follow(window, step)
    return step.state


#: How a chunk's delivery ends without failing: fenced (Ignore), handed back (Reject), retried (Retry).
QUIET = (Ignore, Reject, Retry)


def _delivery(task: Any, chunk: Chunk, window: BatchWindow) -> dict[str, Any]:
    """A chunk span's attributes: which chunk, and which delivery of it: `again` when this message of it began
    before (its earlier delivery died, or was cut off and fenced), `redelivered` as the broker flags it, `retries`."""
    if not tracing.ON:
        return {}
    request = task.request
    info = getattr(request, "delivery_info", None) or {}
    return {
        "chordflow.batch": chunk.batch, "chordflow.chunk.start": chunk.start, "messaging.message.id": request.id or "",
        "chordflow.delivery.again": window.again, "chordflow.delivery.redelivered": bool(info.get("redelivered")),
        "chordflow.delivery.retries": request.retries or 0,
    }  # fmt: skip


def _run(
    task: Any, chunk: Chunk, payloads: list[bytes], state: RunState, began: float, end: int | None
) -> tuple[bytes, int]:
    """The chunk's outcomes (codec bytes) and how many items ran; `payloads`: its encoded blocks of items, run up to
    `end` (None: all of them)."""
    batch = chunk.batch
    stop, changed = state.chunk_start(batch)
    if stop:
        logs.chunk(chunk.run, batch.split("#", 1)[0], batch, chunk.start, 0, 0, time.monotonic() - began)
        return snapshot.encode(ChunkResult(chunk.start, [], [], {}).to_wire()), 0
    # the batch's limits as `chordflow update` left them: threads, permits and threshold of this chunk
    executor = chunk_executor(overrides.apply_to_node(chunk.node, changed), _snapshot(chunk.snap, state))
    spec = executor.spec.batch
    assert spec is not None
    blocks = [snapshot.decode(payload) for payload in payloads]
    starts = list(itertools.accumulate((len(block) for block in blocks[:-1]), initial=chunk.start))
    items = [item for block in blocks for item in block][: None if end is None else end - chunk.start]
    hooks = chunk_middleware(
        state, batch, spec.fail_fast, chunk=chunk.start, max_concurrent=spec.max_concurrent,
        tolerance=tolerance_of(spec), task=task,
    )  # fmt: skip
    stop = stop_of(hooks)
    assert stop is not None
    back = handback.Handback(BatchWindow(state, batch, chunk.plan), chunk.start, items, starts, stop)
    waiting = [i for i, hook in enumerate(hooks) if hook.waits]
    hooks.insert((waiting[-1] if waiting else 0) + 1, back)  # after the stop check and the permits: taken, it starts
    with (
        context.using(RunContext(answers=RedisAnswers(state), budget=budgets.in_redis(state))),  # model calls
        draining.running(back),
    ):
        outcomes = back.settle(run_slice(executor, items, chunk.start, hooks))  # on threads with batch.parallel
    seconds = time.monotonic() - began
    logs.chunk(chunk.run, executor.node_id, batch, chunk.start, len(outcomes.results), len(outcomes.failures), seconds)
    return snapshot.encode(outcomes.to_wire(), label=f"batch '{executor.node_id}' results"), len(outcomes.results)


def _crashed(window: BatchWindow, chunk: Chunk, exc: BaseException) -> None:
    """A chunk raised: a cluster run fails naming the cause; a client following the batch is told. (A chunk of a
    window that is gone, e.g. sent by hand, only raises.)"""
    window.state.abort(chunk.batch)  # the batch can never be merged: its other chunks stop between items
    try:
        merge = Header.from_wire(window.header()).merge
    except LookupError:
        return
    cause = "" if isinstance(exc, SameForEveryItem) else "a chunk failed on a worker: "
    error = redact.mask(f"batch node '{merge.node}': {cause}{exc}")
    window.crash(error)
    if merge.advance is not None:
        batch_failed(merge, error)


@task(name=MERGE, ignore_result=True)
def aggregate(message: dict[str, Any]) -> str:
    """The merge task: once every chunk of the batch has finished (or stopped), merge their outcomes by index (the
    same merge as in-process), store the batch result in Redis and wake whoever goes on: the waiting scheduler
    (through the run's stream) or, for a run that lives in the cluster (`advance` in the message), the next
    `chordflow.advance`. Safe to run twice: a stored result is not merged again, only its advance sent again (the
    step fence drops a second one).

    A cluster run's chunk outcomes are kept per batch: `results --node` streams them, a batch cut short
    (cancelled) resumes with only the items that have no outcome, and one resumed merges them with its new chunks.
    A batch stopped by its failure threshold has items without an outcome too: merge reports it (`stopped`)
    and the batch node fails with the threshold's verdict.
    """
    merge = Merge.from_wire(message)
    state = RunState(merge.run)
    window = BatchWindow(state, merge.batch)
    if state.batch_result(merge.batch) is None:
        _end_span(merge)
        if merge.snapshot is not None:  # every chunk has run: the batch's snapshot is needed no more
            state.drop_snapshot(merge.snapshot)
        chunk_results = window.outcomes()
        if merge.advance is not None:
            runs = ClusterRuns()
            cancelled = state.cancelled()  # first: RunPurged for a purged run, before anything is written
            chunks = runs.keep_chunks(merge.run, merge.batch, chunk_results)
            if cancelled:
                runs.set_status(merge.run, "cancelled", "run cancelled", merge.node)
                logs.transition(merge.run, "running", "cancelled", node=merge.node)
                window.drop()  # no longer a batch sharing the workers
                return "cancelled"
        else:
            chunks = [ChunkResult.from_wire(snapshot.decode(blob)) for blob in chunk_results]
        result = merge_outcomes(chunks, merge.count, merge.fail_fast)
        blob = snapshot.encode(result.to_wire(), label=f"batch '{merge.node}' aggregate")
        state.finish_batch(merge.batch, blob)
        window.drop()
    following = merge.next_advance()
    if following is not None:
        send_advance(following)
    return "stored"


def _end_span(merge: Merge) -> None:
    """Emit the batch's span, begun when it was planned: by the merge that stores its result (a second delivery of
    the merge finds the result stored and emits nothing)."""
    later = tracing.Later.parse(merge.trace)
    if later is not None:
        with tracing.within(merge.run):
            attributes = {"chordflow.node": merge.node, "chordflow.batch": merge.batch, "chordflow.items": merge.count}
            later.end(f"batch {merge.node}", attributes)


def batch_failed(job: Merge, error: str) -> None:
    """A chunk of a cluster run's batch raised (not an item failure: e.g. a result that cannot travel back), so
    the batch will never be merged and no advance follows. Fail the run, naming the cause."""
    RunState(job.run).drop_snapshots()
    ClusterRuns().set_status(job.run, "failed", error, job.node)
    logs.transition(job.run, "running", "failed", node=job.node, error=error)
