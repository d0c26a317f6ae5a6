"""The variants under test. Each `run_*` dispatches one batch of no-op items and waits for all results.

Every variant runs the same PocketFlow `NoopNode` once per item on `dict(shared)` plus the item, and
every Celery variant uses the same app (worker/app.py: msgpack, acks_late, prefetch 1), the same
redis-server and the same two workers.

Internal modules it uses beyond the public API: `worker.cluster.app`, `worker.nodes.echo`, `worker.settings`.
"""

from __future__ import annotations

import contextlib
import gc
import math
from typing import Any

from celery import Celery, chord

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
BODY_TASK = {NAIVE: raw_tasks.COLLECT_TASK, CHUNKED: raw_tasks.CONCAT_TASK, CELERY: "chordflow.aggregate"}


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


def stock_client() -> Celery:
    """A stock Celery app with exactly worker/app.py's configuration, for dispatching the raw baselines.

    Same broker, serializer (msgpack), acks_late, prefetch, queue and chord ordering as chordflow's app;
    only the result backend class is Celery's own RedisBackend: what a raw-Celery user writes. (chordflow's
    RunResultBackend skips result subscriptions only inside `backend.quiet()`, around its own chord
    dispatch, so `.get()` works on chordflow's app as well; `run.check_get` confirms it at start.)
    """
    from worker import settings
    from worker.cluster import app as worker_app

    client = Celery("chordflow-bench-client", set_as_current=False)
    client.conf.update(worker_app.config(settings.load()))
    return client


def settle(client: Celery, wait: float = 0.05) -> int:
    """Between runs (never timed): release the last run's results and read their unsubscribe replies.

    The stock client keeps every chord member it subscribed to as a pending result (here: until exit)
    and unsubscribes when one is released; the replies (2,001 after a naive 2k run) otherwise sit in
    the pub/sub socket and are read, one per drain step, inside the NEXT run's `.get()` (measured:
    +0.2 s on a 10k hand-chunked run). Returns how many replies were read.
    """
    backend = client.backend
    with contextlib.suppress(Exception):  # Celery internals: best effort
        for mapping in backend._pending_results:
            for waiters in list(mapping.values()):
                for result in list(waiters.values()):
                    backend.remove_pending_result(result)
    gc.collect()
    pubsub = getattr(backend.result_consumer, "_pubsub", None)
    read = 0
    while pubsub is not None and pubsub.connection is not None and pubsub.connection.can_read(timeout=wait):
        pubsub.get_message(timeout=0)
        read += 1
    return read


def run_naive(client: Celery, items: list[Any], shared: dict[str, Any]) -> None:
    """What a newcomer writes: one task per item, `chord(header)(callback).get()`."""
    header = [client.signature(raw_tasks.NAIVE_TASK, args=(shared, item)) for item in items]
    result = chord(header, app=client)(client.signature(raw_tasks.COLLECT_TASK))
    value = result.get(timeout=RESULT_TIMEOUT)
    _check(NAIVE, value["count"], value["results"], len(items))


def chunk_count(processes: int, per_process: int = 4) -> int:
    return processes * per_process


def run_chunked(client: Celery, items: list[Any], shared: dict[str, Any], chunks: int) -> None:
    """What an expert writes by hand: `chunks` slices (4 per worker process), ordered concatenation."""
    size = max(1, math.ceil(len(items) / chunks))
    header = [
        client.signature(raw_tasks.CHUNK_TASK, args=(shared, items[a : a + size])) for a in range(0, len(items), size)
    ]
    result = chord(header, app=client)(client.signature(raw_tasks.CONCAT_TASK))
    value = result.get(timeout=RESULT_TIMEOUT)
    _check(CHUNKED, value["count"], value["results"], len(items))


def run_chordflow(items: list[Any], backend: str, **extra_inputs: Any) -> None:
    """chordflow's public API: scheduler.run(workflow, inputs, backend=...)."""
    result = scheduler.run(WORKFLOW, {"items": items, **extra_inputs}, backend=backend)
    aggregate = result.shared[raw_tasks.NODE_ID]
    if result.status != "success" or aggregate["success_count"] != len(items):
        raise WrongResult(f"chordflow {backend}: status={result.status} aggregate count={aggregate.get('count')}")
    _check(f"chordflow {backend}", aggregate["count"], aggregate["results"], len(items))


def plain_loop(items: list[Any], shared: dict[str, Any]) -> list[Any]:
    """The fair floor for the local per-item cost: the same NoopNode per item, no engine, each item's namespace kept.

    A batch has to hand back every item's result, so this is the loop chordflow local is judged against.
    """
    node = NoopNode()
    results = []
    for item in items:
        s = dict(shared)
        s["b"] = {}
        s["item"] = item
        node._run(s)
        results.append(s["b"])
    return results


def plain_loop_discarding(items: list[Any], shared: dict[str, Any]) -> None:
    """The same loop minus `results.append`: no per-item result survives (reported beside, not judged)."""
    node = NoopNode()
    for item in items:
        s = dict(shared)
        s["b"] = {}
        s["item"] = item
        node._run(s)
