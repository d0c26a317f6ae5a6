"""How a batch is cut into chunks.

Auto rule: `chunks_per_process` (default 4) chunks per worker process in the cluster, so work balances
when items are uneven, capped at `max_chunk_size` items (default 5000) so a lost chunk costs little; a
parallel batch's chunk holds at least as many items as its threads. `batch.chunk_size` overrides it. This is the
largest auto chunk: within it, fair dispatch sizes each chunk by the batch's measured time per item (about
`CHORDFLOW_CHUNK_SECONDS` of work, worker/cluster/state/lua/batch_window.lua). The cluster's process count comes
from the worker registry (worker/cluster/state/heartbeat.py), never a broadcast.
"""

from __future__ import annotations

import math
import threading
import time

from worker.cluster.state import heartbeat, runstate

#: Processes assumed while no worker is registered (the chunks wait in the queue for one).
FALLBACK_PROCESSES = 2
#: Seconds a registry read is reused: runs started together read it once.
CACHE_SECONDS = 3.0
NO_WORKER_HINT = "no chordflow worker is registered; chunks will wait in the queue until one starts"

_cache: dict[str, tuple[float, int]] = {}  # state Redis URL -> (read at, processes)
_lock = threading.Lock()


def chunk_size(count: int, requested: int | None, processes: int, per_process: int, cap: int, threads: int = 1) -> int:
    """`requested`, else the auto rule; a parallel batch's chunk holds at least as many items as the threads
    it runs on (`threads`), so a worker's chunk can keep all of them busy."""
    if requested:
        return requested
    return max(1, threads, min(cap, math.ceil(count / max(1, processes * per_process))))


def slices(count: int, size: int, offset: int = 0) -> list[tuple[int, int]]:
    """[start, end) spans of at most `size` items covering `count` items from `offset`."""
    return [(offset + start, offset + min(start + size, count)) for start in range(0, count, size)]


def last_read(url: str) -> tuple[float, int] | None:
    """When (monotonic) the process count of the workers at `url` was last read, and what it was; None: never."""
    return _cache.get(url)


def registered_processes(url: str, max_age: float = CACHE_SECONDS) -> int:
    """Total pool processes of the workers registered in the state Redis at `url` (0: none).

    A count is reused for `max_age` seconds; none registered is never cached, so a worker that has just
    started is seen by the next batch.
    """
    now = time.monotonic()
    cached = _cache.get(url)
    if cached and now - cached[0] < max_age:
        return cached[1]
    with _lock:  # one read for every thread that finds the cache stale at once
        cached = _cache.get(url)
        if cached and time.monotonic() - cached[0] < max_age:
            return cached[1]
        total = sum(heartbeat.pool_sizes(runstate.client(url)).values())
        if total:
            _cache[url] = (time.monotonic(), total)
    return total
