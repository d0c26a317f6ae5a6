"""Durable waits: what a `wait` node waits for, where a run's waits and signals live, and how they read.

A wait is keyed like a batch (`<node id>#<step>`): the time it began is recorded the first time its node runs, so a
run resumed, or an advance delivered again, waits until the same due time, not a new one. A signal sent to a run is
kept until a wait for its event takes it: one sent before the run reaches its wait releases that wait at once.
Where they live is the run's store (`Waits`): the embedded store for a local run (worker/runs/sqlite.py), Redis
for a cluster run (worker/cluster/waits.py), memory for a flow run with no record. How a run waits is the store's
too: a local run's process sleeps, a cluster run's advance ends and a worker's timer thread sends the next one.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ir.errors import RunCancelled

#: Seconds between two looks at the store while a run's process waits (a signal from elsewhere, a cancel).
POLL_SECONDS = 0.2


@dataclass(frozen=True)
class Waiting:
    """What a waiting run shows (`status`, `runs`, `top`, the dashboard): the node, when it ends at the latest
    (epoch seconds; None: only its event ends it) and the event it waits for (None: a time). A run waiting for
    provider batches (worker/llm/provider_batches.py) lists them in `batches` ({provider, id, base_url, total,
    done, failed, status}), `due` its next look at them and `deadline` when it stops waiting for them."""

    key: str
    node: str
    due: float | None
    event: str | None
    batches: tuple[dict[str, Any], ...] = ()
    deadline: float | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = {"key": self.key, "node": self.node, "due": self.due, "event": self.event}
        return wire | ({"batches": list(self.batches), "deadline": self.deadline} if self.batches else {})

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Waiting:
        batches = tuple(wire.get("batches") or ())
        return cls(wire["key"], wire["node"], wire.get("due"), wire.get("event"), batches, wire.get("deadline"))

    def describe(self) -> str:
        """`waiting until 06:00 UTC`, `waiting for event 'approved' (until 06:00 UTC)`, `waiting for 2 provider
        batches: 1,200/10,000 answered, deadline 06:00 UTC`."""
        if self.batches:
            total = sum(b.get("total") or 0 for b in self.batches)
            done = sum((b.get("done") or 0) + (b.get("failed") or 0) for b in self.batches)
            plural = "es" if len(self.batches) > 1 else ""
            deadline = f", deadline {clock(self.deadline)}" if self.deadline is not None else ""
            return f"waiting for {len(self.batches)} provider batch{plural}: {done:,}/{total:,} answered{deadline}"
        until = f"until {clock(self.due)}" if self.due is not None else ""
        if self.event is None:
            return f"waiting {until}"
        return f"waiting for event '{self.event}'" + (f" ({until})" if until else "")


def clock(when: float) -> str:
    """`06:00 UTC` today, `2026-12-06 06:00 UTC` on another day."""
    moment, today = time.gmtime(when), time.gmtime()
    same_day = moment[:3] == today[:3]
    return time.strftime("%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC", moment)


class Waits(Protocol):
    """A run's waits and signals, where its state lives."""

    def begin(self, key: str, now: float) -> float:
        """When the wait at `key` began: `now` the first time, the recorded time after."""
        ...

    def take(self, key: str, event: str) -> tuple[bool, Any]:
        """(True, data) once a signal of `event` has released the wait at `key` (taken from the run's signals the
        first time, kept with the wait after: asked again, the same answer); else (False, None)."""
        ...

    def hold(self, waiting: Waiting, cancelled: threading.Event) -> None:
        """Wait a while: until due, a signal may have come, or (RunCancelled) the run is cancelled. A cluster
        run's store records the timer and suspends the advance instead (worker/engine/steps.py Suspended)."""
        ...

    def end(self, key: str) -> None:
        """The wait at `key` is over: the run no longer shows it, its timer goes."""
        ...


def sleep(waiting: Waiting, cancelled: threading.Event) -> None:
    """Hold in this process: until `waiting` is due or POLL_SECONDS have passed, whichever comes first."""
    left = POLL_SECONDS if waiting.due is None else min(POLL_SECONDS, max(0.0, waiting.due - time.time()))
    if cancelled.wait(left):
        raise RunCancelled("run cancelled")


class MemoryWaits:
    """The waits of a flow run with no record (`compile(...).run(shared)`): nothing can signal it."""

    def __init__(self) -> None:
        self.began: dict[str, float] = {}

    def begin(self, key: str, now: float) -> float:
        return self.began.setdefault(key, now)

    def take(self, key: str, event: str) -> tuple[bool, Any]:
        return False, None

    def hold(self, waiting: Waiting, cancelled: threading.Event) -> None:
        sleep(waiting, cancelled)

    def end(self, key: str) -> None:
        self.began.pop(key, None)
