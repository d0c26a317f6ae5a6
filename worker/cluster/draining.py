"""Drain on SIGTERM: a worker stops in seconds, not after whole chunks.

Celery's warm shutdown (SIGTERM, SIGINT) takes no new message and waits for the tasks running to end: whole chunks,
minutes at times, past the 30 s an orchestrator gives a pod before SIGKILL (its chunk then waits for the
dead-delivery bound). So a warm shutdown also begins a drain in every process running chunks: the main process
(`-P solo`, `-P threads`) and each prefork child, told by SIGUSR2 (the signal reaches the main process only; Celery
and billiard leave SIGUSR2 to the application). There a thread tells each running chunk's hook (`Drainable`:
worker/cluster/batches/handback.py) when the grace ends (CHORDFLOW_DRAIN_GRACE); the chunk takes no more items,
hands back at once those it has not started, and ends when its items in flight do, or at the grace, when its
StopSignal ends their waits. A chunk that begins after the drain began is given back whole (`began`).
The Celery signals that call `listen`, `keep_pool` and `tell_pool` are connected in worker/cluster/app.py.

The signal handler only sets an Event that no thread of the main flow waits on (a handler that set one the
interrupted code holds would deadlock); the thread does the Redis and broker work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from worker import settings

log = logging.getLogger(__name__)

#: What the main process sends its pool children when a warm shutdown begins.
SIGNAL = signal.SIGUSR2

_began = threading.Event()
_lock = threading.Lock()
_running: set[Drainable] = set()
_deadline: list[float] = []  # when this process's drain began: the grace's end (monotonic)
_watcher: list[int] = []  # the pid whose watcher thread runs (a fork has none)


class Drainable(Protocol):
    """A running chunk's side of a drain."""

    def drain(self, deadline: float) -> None:
        """Take no more items, hand back those not started; the items in flight may run until `deadline`."""


def began() -> bool:
    """This process drains: a task beginning now is given back."""
    return _began.is_set()


def begin(*_: Any) -> None:
    """Begin this process's drain (the SIGUSR2 handler): safe in a signal handler."""
    _began.set()


@contextlib.contextmanager
def running(chunk: Drainable) -> Iterator[None]:
    """`chunk` is told of a drain while the block runs (at once if the drain began already)."""
    with _lock:
        if _watcher[-1:] != [os.getpid()]:
            _watcher.append(os.getpid())
            threading.Thread(target=_watch, name="chordflow-drain", daemon=True).start()
        _running.add(chunk)
        deadline = _deadline[-1] if _deadline else None
    try:
        if deadline is not None:
            chunk.drain(deadline)
        yield
    finally:
        with _lock:
            _running.discard(chunk)


def _watch() -> None:
    _began.wait()
    grace = settings.load().drain_grace
    with _lock:
        _deadline.append(time.monotonic() + grace)
        chunks = list(_running)
    log.info("draining: %d chunk(s) hand back the items not started; %g s for those in flight", len(chunks), grace)
    for chunk in chunks:
        try:
            chunk.drain(_deadline[-1])
        except Exception as exc:  # Redis or the broker away: the chunk hands its rest back as it ends
            log.warning("draining: a chunk could not hand back its items at once: %s", exc)


def listen(**_: object) -> None:
    """In the main process, before the pool forks: its children inherit the handler."""
    signal.signal(SIGNAL, begin)


_pools: dict[str, Any] = {}  # hostname -> the worker's pool


def keep_pool(sender: Any, **_: object) -> None:
    """At worker_ready: whom to tell."""
    _pools[sender.hostname] = sender.pool


def tell_pool(sender: str, how: str = "Warm", **_: object) -> None:
    """A warm shutdown: every process of the pool drains (the main process itself with a solo or threads pool)."""
    if how != "Warm":
        return
    pool = _pools.get(sender)
    pids = (pool.info.get("processes") if pool is not None else None) or [os.getpid()]
    for pid in pids:
        if pid == os.getpid():
            begin()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, SIGNAL)
