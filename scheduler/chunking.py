"""How a batch is cut into chunks.

Auto rule: `chunks_per_process` (default 4) chunks per worker process in the cluster, so work
balances when items are uneven, capped at `max_chunk_size` items (default 5000) so a chunk stays
well under the visibility timeout and a lost chunk costs little. `batch.chunk_size` overrides it.
"""

from __future__ import annotations

import logging
import math
import time

from celery import Celery

log = logging.getLogger(__name__)
_processes_cache: tuple[float, int] | None = None


def chunk_size(count: int, requested: int | None, processes: int, per_process: int, cap: int) -> int:
    if requested:
        return requested
    return max(1, min(cap, math.ceil(count / max(1, processes * per_process))))


def slices(count: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, count)) for start in range(0, count, size)]


def worker_processes(app: Celery, fallback: int = 2, ttl: float = 60.0) -> int:
    """Total pool processes of the live workers (cached for `ttl`; `fallback` while none answer)."""
    global _processes_cache
    now = time.monotonic()
    if _processes_cache and now - _processes_cache[0] < ttl:
        return _processes_cache[1]
    try:
        stats = app.control.inspect(timeout=0.5).stats() or {}
    except Exception as exc:  # the broker may be slow to answer a broadcast; chunking still works
        log.debug("worker inspect failed: %s", exc)
        stats = {}
    total = sum(int(s.get("pool", {}).get("max-concurrency", 1)) for s in stats.values())
    if not total:
        log.warning("no chordflow worker answered; chunks will wait in the queue until one starts")
        return fallback
    _processes_cache = (now, total)
    return total
