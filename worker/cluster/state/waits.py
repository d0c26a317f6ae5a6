"""A cluster run's waits and signals in Redis (worker/waits.py Waits): what a waiting run records, and what
a signal or a cancel changes. The timers it arms are fired by worker/cluster/waits.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import redis

from worker.cluster.state.keys import TIMERS, RunKeys
from worker.cluster.state.runstate import RunState
from worker.engine.steps import Suspended
from worker.waits import Waiting

#: The run record's field that says what the run waits for (JSON of worker/waits.py Waiting).
WAITING = "waiting"


def member(run_id: str, key: str) -> str:
    return f"{run_id}|{key}"


class RedisWaits:
    """A cluster run's waits (worker/waits.py Waits), used by its advance: holding records the timer and ends
    the advance."""

    def __init__(self, state: RunState):
        self.state, self.redis, self.keys = state, state.redis, state.keys

    def begin(self, key: str, now: float) -> float:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hsetnx(self.keys.waits, f"began:{key}", repr(now))
        pipe.expire(self.keys.waits, self.state.ttl)
        pipe.hget(self.keys.waits, f"began:{key}")
        return float(pipe.execute()[2])

    def take(self, key: str, event: str) -> tuple[bool, Any]:
        released = f"released:{key}"
        with self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(self.keys.signals)
                    kept = pipe.hget(self.keys.waits, released)
                    if kept is not None:
                        return True, json.loads(kept)
                    data = pipe.hget(self.keys.signals, event)
                    if data is None:
                        return False, None
                    pipe.multi()
                    pipe.hset(self.keys.waits, released, data)
                    pipe.hdel(self.keys.signals, event)
                    pipe.execute()
                    return True, json.loads(data)
                except redis.WatchError:  # a signal came meanwhile: look again
                    continue

    def hold(self, waiting: Waiting, cancelled: threading.Event) -> None:
        name = member(self.state.run_id, waiting.key)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.run, WAITING, json.dumps(waiting.to_wire()))
        if waiting.due is not None:
            pipe.zadd(TIMERS, {name: waiting.due})
        pipe.hexists(self.keys.signals, waiting.event or "")
        pipe.exists(self.keys.cancel)
        *_, signalled, cancel = pipe.execute()
        # A signal or a cancel that came before `waiting` was recorded did not see the run waiting: fire now.
        if (waiting.event is not None and signalled) or cancel:
            self.redis.zadd(TIMERS, {name: 0})
        raise Suspended

    def end(self, key: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self.keys.run, WAITING)
        pipe.zrem(TIMERS, member(self.state.run_id, key))
        pipe.execute()


def waiting(client: redis.Redis, run_id: str) -> Waiting | None:
    """What a cluster run waits for now, if it waits."""
    raw = client.hget(RunKeys(run_id).run, WAITING)
    return None if raw is None else Waiting.from_wire(json.loads(raw))


def signal(client: redis.Redis, run_id: str, event: str, data: Any, ttl: int) -> None:
    """Keep `event` with its data for the run's wait; a run waiting for it goes on at the next sweep."""
    keys = RunKeys(run_id)
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.signals, event, json.dumps(data))
    pipe.expire(keys.signals, ttl)
    pipe.execute()
    now = waiting(client, run_id)
    if now is not None and now.event == event:
        client.zadd(TIMERS, {member(run_id, now.key): 0})


def wake(client: redis.Redis, run_id: str) -> None:
    """A waiting run's next advance goes at the next sweep (it was cancelled: the advance ends it)."""
    now = waiting(client, run_id)
    if now is not None:
        client.zadd(TIMERS, {member(run_id, now.key): 0})
