"""Node types that count their executions in Redis: `test-count` for the dead-worker tests
(tests/worker/cluster/faults/test_dead_workers.py), `test-ledger` for the fault campaign (tests/chaos/), which also
records each execution's start and end times so concurrency can be measured.

It runs inside real worker processes (a CHORDFLOW_PLUGINS module), so what it records goes to the cluster's Redis.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import redis
from pocketflow import Node

from ir.errors import Outage
from worker.cluster.state.runstate import client
from worker.nodes import register

#: Seconds an item waits for its hold to be lifted, at most.
HOLD_LIMIT = 120


def worker_name() -> str:
    """The short name of the worker running this item (`k1` of `k1@host`)."""
    from celery import current_task

    hostname = current_task.request.hostname if current_task else None
    return (hostname or "in-process").split("@", 1)[0]


class _Recorded(Node):
    """An item that records itself in the cluster's Redis (`record`), writing `label`. That Redis out of reach past
    the outage budget is an Outage (the chunk is given back), as for chordflow's own calls: not this item's error."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> str:
        try:
            return self.record(params)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Outage(f"{type(self).__name__}: Redis out of reach: {exc}") from exc

    def record(self, params: dict[str, Any]) -> str:
        raise NotImplementedError

    def post(self, shared: Any, prep_res: Any, exec_res: str) -> str:
        shared["label"] = exec_res
        return "default"


@register("test-count")
class CountNode(_Recorded):
    """Item `label` under params `key`: `RPUSH <key>:runs "<worker> <label>"` as it starts (and `ZADD <key>:began`
    of "<worker> <label>" at its wall-clock start time, kept from the first time); then, while the key
    `<key>:hold:<worker>:<label>` exists, waits (a test holds one worker at one item); then `seconds` of work; then
    the side effect, counted: `HINCRBY <key>:effects <label> 1`. Writes `label`. Its Redis is the cluster's own, so
    losing it past the outage budget is an Outage (the chunk is given back), as for chordflow's own calls."""

    def record(self, params: dict[str, Any]) -> str:
        state, key, label, worker = client(), params["key"], str(params["label"]), worker_name()
        pipe = state.pipeline(transaction=False)
        pipe.rpush(f"{key}:runs", f"{worker} {label}")
        pipe.zadd(f"{key}:began", {f"{worker} {label}": time.time()}, nx=True)
        pipe.execute()
        deadline = time.monotonic() + HOLD_LIMIT
        while state.exists(f"{key}:hold:{worker}:{label}") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(float(params.get("seconds", 0)))
        state.hincrby(f"{key}:effects", label, 1)
        return label


@register("test-ledger")
class LedgerNode(_Recorded):
    """Item `label` under params `key`, for the fault campaign (tests/chaos/): `RPUSH <key>:runs "<label> <start>
    <pid> <token>"` as each execution starts; then `seconds` of work; then, unless `fail`, the side effect
    (`HSET <key>:effects <token> <label>`), and `HSET <key>:spans <token> "<label> <start> <end>"` (wall-clock
    seconds, so concurrency is measured across workers); with `fail` it records the span and raises. Writes `label`.

    Each execution has its own token and every write is keyed by it, so a write Redis ran whose reply was lost (a
    restart fault) and that the client sent again counts once: the ledger counts what the engine did, not retries.
    """

    def record(self, params: dict[str, Any]) -> str:
        state, key, label, token = client(), params["key"], str(params["label"]), uuid.uuid4().hex[:12]
        began = time.time()
        state.rpush(f"{key}:runs", f"{label} {began:.6f} {os.getpid()} {token}")
        time.sleep(float(params.get("seconds", 0)))
        span = f"{label} {began:.6f} {time.time():.6f}"
        if params.get("fail"):
            state.hset(f"{key}:spans", token, span)
            raise RuntimeError(f"item {label} fails on purpose")
        pipe = state.pipeline(transaction=False)
        pipe.hset(f"{key}:effects", token, label)
        pipe.hset(f"{key}:spans", token, span)
        pipe.execute()
        return label
