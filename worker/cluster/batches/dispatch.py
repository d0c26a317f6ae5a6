"""Dispatch of one batch as ONE chord: `run_chunk` tasks over slices of the items, an `aggregate` body.

Used by the scheduler's celery backend (which then follows the run's progress stream) and by
`chordflow.advance` on a worker (which then ends: the body enqueues the next advance). The snapshot is
encoded once per batch: inline under a size threshold, else stored once in Redis by content hash.
Only the items without an outcome (`BatchJob.missing()`) are dispatched, so a resumed batch re-runs
nothing that finished.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery import chord

from ir import snapshot
from worker import settings
from worker.batch.backend import BatchJob
from worker.batch.executor import threads_for
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.state.runstate import RunState

log = logging.getLogger(__name__)


def dispatch_batch(
    job: BatchJob, run_id: str, *, advance_step: int | None = None, branch: tuple[str, str] | None = None
) -> Any:
    """Send the chord for `job`'s missing items; returns the chord's AsyncResult.

    `advance_step`: the chord body enqueues `chordflow.advance(run_id, advance_step)` once it has stored
    the merged result (cluster-orchestrated runs); None when a client waits for the result itself.
    `branch`: (section key, branch) of a parallel branch: the body enqueues `chordflow.advance_branch` instead.
    """
    s = settings.load()
    app = current_app(s)
    state = RunState(run_id)
    node_id, items = job.node_id, job.items
    blob = snapshot.encode(snapshot.snapshot_of(job.shared), label="shared")
    gaps = job.missing()
    todo = sum(end - start for start, end in gaps)
    processes = chunking.registered_processes(s.result_backend) or chunking.FALLBACK_PROCESSES
    threads = threads_for(job.batch, todo)
    size = chunking.chunk_size(todo, job.batch.chunk_size, processes, s.chunks_per_process, s.max_chunk_size, threads)
    spans = [span for start, end in gaps for span in chunking.slices(end - start, size, offset=start)]
    # Encode every slice before anything is enqueued: a value that cannot travel fails early.
    payloads = [snapshot.encode(items[a:b], label=f"batch '{node_id}' items[{a}:{b}]") for a, b in spans]
    inline = len(blob) <= s.snapshot_inline_bytes
    snap: bytes | dict[str, str] = blob if inline else {"ref": state.store_snapshot(blob, job.key)}
    spec = job.spec.wire()
    ids = [uuid.uuid4().hex for _ in spans]
    header = [
        app.signature(
            "chordflow.run_chunk",
            ({"run": run_id, "batch": job.key, "node": spec, "snap": snap, "start": a, "items": payload},),
            task_id=task_id,
            argsrepr=f"batch={node_id} items[{a}:{b}] run={run_id}",
            kwargsrepr="{}",
        )
        for (a, b), payload, task_id in zip(spans, payloads, ids, strict=True)
    ]
    meta = {"run": run_id, "batch": job.key, "node": node_id, "count": len(items), "fail_fast": job.batch.fail_fast}
    if advance_step is not None:
        meta["advance"] = advance_step
    if branch is not None:
        meta["branch"] = list(branch)
    if not inline:
        meta["snapshot"] = snap["ref"]  # type: ignore[index]  # the body deletes it: no chunk needs it then
    body = app.signature(
        "chordflow.aggregate", (meta,), argsrepr=f"batch={node_id} chunks={len(spans)} run={run_id}", kwargsrepr="{}"
    )
    if advance_step is not None:  # nobody waits on the chord: a chunk that crashes must fail the run itself
        body.on_error(app.signature("chordflow.batch_failed", (meta,)))
    state.record_chunks(ids)
    state.describe(status="running", node=node_id, items=len(items), chunks=len(spans))
    state.set_batch_total(job.key, len(items))
    with app.backend.quiet():
        result = chord(header, app=app)(body)
    log.info("run %s: batch %s -> %d chunks of <= %d items", run_id, node_id, len(spans), size)
    return result
