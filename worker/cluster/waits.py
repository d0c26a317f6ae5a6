"""Timers of waiting runs: a waiting run holds no task, thread or process slot.

A `wait` node that is not yet released records in the run's Redis state what it waits for, when it began, and its
due time in `cf:{timers}` (worker/cluster/state/waits.py), then its advance ends (Suspended). Every worker keeps a
`TimerSweeper`; at most one sweep starts per interval across the cluster (a key SET NX), and it sends the next
`chordflow.advance` of each run whose time has come: the advance runs the wait node again, which finds itself due,
or released by a signal, and the run goes on. Nothing here is a Celery ETA or countdown task (on Redis those come
back after the visibility timeout), and nothing lives in a worker: every worker and the client may die, and Redis
restart (with AOF), and the run still goes on when it is due.

A signal (`scheduler.signal`) is kept in the run's `signals` until a wait takes it, and moves the waiting run's
timer to now; a cancel moves it to now too (`wake`), so the advance sees the cancel. An advance sent twice is
harmless (it is fenced by the run's lease and step), so a sweep that dies between sending and re-arming the timer
only costs a second advance, and a timer fired whose advance got lost fires again after REFIRE_SECONDS.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from worker.cluster import priorities, sending
from worker.cluster.messages import Advance
from worker.cluster.sending import client as _client
from worker.cluster.state.keys import TIMER_SWEEP, TIMERS, RunKeys
from worker.periodic import Periodic
from worker.runs.record import FINAL

log = logging.getLogger(__name__)

#: Seconds between two timer sweeps: a timer fires within about this long of its due time.
SWEEP_SECONDS = 0.5
#: Timers fired per sweep, at most (the most overdue first); the rest fire at the next sweep.
PER_SWEEP = 1000
#: Seconds after which a fired timer fires again if its run still waits (its advance was lost).
REFIRE_SECONDS = 60.0


def sweep(app: Any, now: float | None = None) -> int:
    """Send the next advance of every run whose timer is due; returns how many were sent."""
    client = _client(app)
    now = time.time() if now is None else now
    due = [raw.decode() for raw in client.zrangebyscore(TIMERS, "-inf", now, start=0, num=PER_SWEEP)]
    sent = 0
    for name in due:
        run_id, _, key = name.partition("|")
        keys = RunKeys(run_id)
        pipe = client.pipeline(transaction=False)
        pipe.hget(keys.run, "status")
        pipe.hget(keys.run, "priority")
        pipe.exists(keys.lease)
        status, priority, leased = pipe.execute()
        if status is None or status.decode() in FINAL:  # ended or purged meanwhile
            client.zrem(TIMERS, name)
            continue
        if leased:  # its advance is running (maybe the one that is about to hold): the next sweep looks again
            continue
        advance = Advance(run_id, int(key.rsplit("#", 1)[1]))
        sending.send(app, advance, priority=(priority or b"normal").decode(), kind=priorities.CONTROL)
        client.zadd(TIMERS, {name: now + REFIRE_SECONDS}, xx=True, gt=True)  # unless its wait ended meanwhile
        sent += 1
    return sent


class TimerSweeper(Periodic):
    """A worker's timer sweeps, every SWEEP_SECONDS, until `stop()`; at most one sweep of the cluster starts per
    interval (two that overlap only send an advance twice, which the advance's fence makes harmless)."""

    name = "chordflow-timers"

    def __init__(self, app: Any):
        super().__init__(SWEEP_SECONDS)
        self.app = app

    def tick(self) -> None:
        try:
            if _client(self.app).set(TIMER_SWEEP, 1, nx=True, px=int(self.interval * 1000)):
                with self.app.backend.quiet():  # nobody waits on an advance's Celery result
                    sent = sweep(self.app)
                if sent:
                    log.info("timers: %d waiting runs go on", sent)
        except Exception as exc:  # Redis or the broker away for a moment: the next sweep tries again
            log.warning("could not fire due timers: %s", exc)
