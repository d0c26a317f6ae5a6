"""Fair dispatch of one batch: its chunks go to the broker a window at a time, the rest as chunks finish.

One Celery chord would put every chunk in the queue at once, and a queue is first in, first out: a three-item
run submitted behind a million-item batch would wait for all of it. Instead the batch is planned in Redis
(worker/cluster/state/windows.py: its items in blocks, the chunk header, what is left) before anything is sent,
at most `window` chunks (worker processes + 1) are in flight per batch, and each finishing chunk hands out the
next ones (`send_chunks`, from `chordflow.run_chunk`). Runs of the same priority so take turns on the workers;
a higher priority's messages go first (worker/cluster/priorities.py). Auto chunks hold about
`CHORDFLOW_CHUNK_SECONDS` of work measured on the batch's finished chunks (one block until one has finished),
within the count caps of chunking.py. The chunk that finishes last sends `chordflow.aggregate`, the merge task
(in the role of a chord's callback): it merges the outcomes in input order.

The snapshot is encoded once per batch: inline under a size threshold, else stored once in Redis by content
hash. Only the items without an outcome (`BatchJob.missing()`) are planned, so a resumed batch re-runs nothing
that finished.
"""

from __future__ import annotations

import logging
import math

from ir import snapshot
from worker import settings, tracing
from worker.batch.backend import BatchJob
from worker.batch.executor import threads_for
from worker.cluster import priorities, sending
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.messages import Advance, AdvanceBranch, Header, Merge
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.cluster.state.windows import BatchWindow, WindowStep

log = logging.getLogger(__name__)

#: Blocks a batch's items are stored in, at most (a chunk is one or more consecutive blocks).
MAX_BLOCKS = 1000


def dispatch_batch(
    job: BatchJob,
    run_id: str,
    *,
    advance_step: int | None = None,
    branch: tuple[str, str] | None = None,
    priority: str = "normal",
) -> BatchWindow:
    """Plan `job`'s missing items in Redis and send the first window of chunks; returns the batch's window.

    `advance_step`: the merge enqueues `chordflow.advance(run_id, advance_step)` once it has stored the result
    (cluster-orchestrated runs); None when a client waits for the result itself. `branch`: (section key, branch)
    of a parallel branch: the merge enqueues `chordflow.advance_branch` instead.
    """
    s = settings.load()
    state = RunState(run_id)
    node_id, items = job.node_id, job.items
    blob = snapshot.encode(snapshot.snapshot_of(job.shared), label="shared")
    gaps = job.missing()
    todo = sum(end - start for start, end in gaps)
    processes = chunking.registered_processes(s.result_backend) or chunking.FALLBACK_PROCESSES
    threads = threads_for(job.batch, todo)
    largest = chunking.chunk_size(
        todo, job.batch.chunk_size, processes, s.chunks_per_process, s.max_chunk_size, threads
    )
    block = largest if job.batch.chunk_size else max(threads, min(largest, math.ceil(todo / MAX_BLOCKS)))
    spans = [span for start, end in gaps for span in chunking.slices(end - start, block, offset=start)]
    # Encode every block before anything is stored or sent: a value that cannot travel fails early.
    blocks = [(a, b, snapshot.encode(items[a:b], label=f"batch '{node_id}' items[{a}:{b}]")) for a, b in spans]
    inline = len(blob) <= s.snapshot_inline_bytes
    snap: bytes | dict[str, str] = blob if inline else {"ref": state.store_snapshot(blob, job.key)}
    merge = Merge(
        run_id, job.key, node_id, len(items), job.batch.fail_fast, advance_step, branch,
        None if inline else snap["ref"],  # type: ignore[index]  # the merge deletes it: no chunk needs it then
        _begun(),
    )  # fmt: skip
    window = BatchWindow(state, job.key)
    # A batch of at most processes + 1 chunks goes whole: it cannot hold the queue, and a window of one would send
    # a three-item run's chunks through the queue one after another behind every other batch.
    size = max(window_size(processes, window.open_windows()), min(processes + 1, len(spans)))
    header = Header(job.spec.wire(), snap, merge, window.plan_id)
    state.describe(status="running", node=node_id, items=len(items), blocks=len(spans))
    state.set_batch_total(job.key, len(items))
    step = window.plan(
        blocks, header.to_wire(), window=size, max_items=largest, min_items=threads,
        chunk_seconds=s.chunk_seconds, priority=priority,
    )  # fmt: skip
    follow(window, step, header)
    log.info("run %s: batch %s -> %d blocks of <= %d items, %d in flight", run_id, node_id, len(spans), block, size)
    return window


def _begun() -> str | None:
    """The batch's span, begun as it is planned (under the step's); None when tracing is off."""
    later = tracing.Later.begin()
    return later.wire() if later else None


def redispatch(job: BatchJob, run_id: str) -> bool:
    """A batch already dispatched, seen again by a redelivered advance (its first delivery died between marking the
    batch dispatched and sending its chunks, or anywhere after): send its claimed chunks again (the first message of
    each to begin runs it: BatchWindow.begin) and the merge if it ended. False when it was never planned (the caller
    plans it, as the first time)."""
    window = BatchWindow(RunState(run_id), job.key)
    try:
        step = window.pending()
    except LookupError:
        return False
    log.info("run %s: batch %s was dispatched before: its %d chunks in flight go again", run_id, job.key,
             len(step.chunks))  # fmt: skip
    follow(window, step)
    return True


def window_size(processes: int, open_windows: int) -> int:
    """Chunks of one batch in flight: the workers' processes + 1 (one waiting per process, so none idles between a
    chunk and the next) shared by the open batches, at least one each."""
    return max(1, math.ceil((processes + 1) / open_windows))


def follow(window: BatchWindow, step: WindowStep, header: Header | None = None) -> None:
    """Send what a step of the window claimed, and the merge once the batch has ended."""
    if not (step.chunks or step.ended):
        return
    header = header or Header.from_wire(window.header())  # read once
    if step.chunks:
        send_chunks(window, step, header)
    if step.ended:
        send_merge(step, header.merge)


def send_chunks(window: BatchWindow, step: WindowStep, header: Header) -> None:
    """One `chordflow.run_chunk` per claimed chunk, at the run's priority aged by its last chunk's queue wait (a copy
    sent by aging carries the chunk's blocks, read from the window, instead of its items: worker/cluster/aging.py)."""
    app, merge = current_app(), header.merge
    ids = []
    # Every claimed chunk's items in one read, before any is sent: once a chunk runs, the run may end (a crash)
    # and its window go with the run's trim.
    blocks = [block for chunk in step.chunks for block in chunk.blocks]
    payloads = dict(zip(blocks, window.items(blocks), strict=True))
    with app.backend.quiet():  # nobody waits on a chunk's Celery result: no subscription per message
        for chunk in step.chunks:
            task_id = sending.send(
                app, header.chunk(chunk.start, items=[payloads[b] for b in chunk.blocks]), priority=step.priority,
                kind=priorities.CHUNK, waited=step.waited, copy=header.chunk(chunk.start, blocks=chunk.blocks),
                kwargsrepr="{}", argsrepr=f"batch={merge.node} items[{chunk.start}:{chunk.end}] run={merge.run}",
            )  # fmt: skip
            ids.append(task_id)
    window.state.record_chunks(ids)


def send_merge(step: WindowStep, merge: Merge) -> None:
    """`chordflow.aggregate`, the merge task: merge the batch's outcomes in input order."""
    app = current_app()
    with app.backend.quiet():
        sending.send(
            app, merge, priority=step.priority, kind=priorities.CONTROL, kwargsrepr="{}",
            argsrepr=f"batch={merge.node} run={merge.run}",
        )  # fmt: skip


def send_advance(message: Advance | AdvanceBranch) -> None:
    """A run's next `chordflow.advance` (or `advance_branch`), at the run's priority: an advance goes before the
    chunks of runs of the same priority."""
    sending.send(current_app(), message, priority=ClusterRuns().priority(message.run), kind=priorities.CONTROL)
