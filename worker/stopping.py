"""A batch's stop signal, which every wait of an item waits on instead of sleeping.

Cancel, fail_fast and a failure threshold stop a batch between items; an item waiting (a rate-limit admission,
a 429's backoff, a retry's pause, a response that has not come) would otherwise hold its chunk, its pool
process and its permit for as long as the wait. The loop running a slice of items installs the slice's
StopSignal in a ContextVar (its item threads copy it); a wait that finds it set raises Stopped, which no
`except Exception` of a node catches: the loop ends there and the interrupted item has no outcome, as an item
the stop kept from starting.

Where the stop comes from: an in-process flag (`also`: a local run's cancel, set by Ctrl-C or SIGTERM), the
signal's own `set` (fail_fast, a threshold crossed), or `poll`, called about every `every` seconds by one watcher
thread per installed signal while the loop runs (a worker's chunk: one Redis read per poll, never per item).
Imports nothing of chordflow: every package may use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Protocol

#: Seconds between two looks at an in-process flag (`also`) while waiting: a stop is seen within this.
SLICE = 0.1


class Stopped(BaseException):
    """A wait ended by the batch's stop. A BaseException, as KeyboardInterrupt: a node's `except Exception`
    (its retries, its fallback, an item's failure) must not turn a stop into an outcome."""


class Flag(Protocol):
    """A flag set elsewhere (threading.Event, a branch's StopFlag)."""

    def is_set(self) -> bool: ...


class StopSignal:
    """One slice's stop: set once, waited on by every item thread of the slice."""

    def __init__(self, also: Flag | None = None, poll: Callable[[], bool] | None = None, every: float = 0.5):
        self.event = threading.Event()
        self.also, self.poll, self.every = also, poll, every
        self.outer: StopSignal | None = None  # the signal of the loop this one runs inside (a sub-run's batch)

    def set(self) -> None:
        self.event.set()

    def is_set(self) -> bool:
        if self.event.is_set():
            return True
        if (self.also is not None and self.also.is_set()) or (self.outer is not None and self.outer.is_set()):
            self.event.set()
            return True
        return False

    def wait(self, seconds: float) -> bool:
        """Wait up to `seconds` for the stop; True when it came."""
        if self.also is None and self.outer is None:
            return self.event.wait(seconds)
        deadline = time.monotonic() + seconds
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.event.wait(min(left, SLICE))
        return True

    def _watch(self, done: threading.Event) -> None:
        assert self.poll is not None
        while not done.wait(self.every) and not self.event.is_set():
            try:
                if self.poll():
                    self.event.set()
            except Exception:  # state out of reach for a moment: the items' own checks still run
                continue


_current: contextvars.ContextVar[StopSignal | None] = contextvars.ContextVar("chordflow_stop", default=None)


def current() -> StopSignal | None:
    return _current.get()


@contextlib.contextmanager
def scope(signal: StopSignal | None) -> Iterator[None]:
    """A loop's stop: `signal` is the waits' stop while the block runs (threads started with a copy of this context
    too) and its `poll` is watched meanwhile. Stopped raised in the block ends the block (the item whose wait it
    ended has no outcome); if the stop came from the loop this one runs inside (a sub-run's batch in an item), it
    goes on to that loop. None: nothing changes."""
    if signal is None:
        yield
        return
    signal.outer = signal.outer or current()
    token = _current.set(signal)
    done = threading.Event()
    if signal.poll is not None:
        threading.Thread(target=signal._watch, args=(done,), name="stop-watch", daemon=True).start()
    try:
        yield
    except Stopped:
        pass
    finally:
        done.set()
        _current.reset(token)
    if signal.outer is not None and signal.outer.is_set():
        raise Stopped


def check() -> None:
    """Raise Stopped if the current stop is set."""
    signal = _current.get()
    if signal is not None and signal.is_set():
        raise Stopped


def sleep(seconds: float) -> None:
    """time.sleep, ended early by the current stop (raising Stopped)."""
    signal = _current.get()
    if signal is None:
        time.sleep(seconds)
    elif signal.wait(seconds):
        raise Stopped


def acquire(lock: threading.Lock) -> None:
    """lock.acquire(), given up when the current stop comes (raising Stopped)."""
    signal = _current.get()
    if signal is None:
        lock.acquire()
        return
    while not lock.acquire(timeout=SLICE):
        if signal.is_set():
            raise Stopped
