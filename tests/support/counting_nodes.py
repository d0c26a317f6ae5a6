"""A node type that counts its executions in Redis, for the dead-worker tests (tests/test_dead_workers.py).

It runs inside real worker processes (a CHORDFLOW_PLUGINS module), so what it records goes to the cluster's Redis.
"""

from __future__ import annotations

import time
from typing import Any

from pocketflow import Node

from worker.cluster.state.runstate import client
from worker.nodes import register

#: Seconds an item waits for its hold to be lifted, at most.
HOLD_LIMIT = 120


def worker_name() -> str:
    """The short name of the worker running this item (`k1` of `k1@host`)."""
    from celery import current_task

    hostname = current_task.request.hostname if current_task else None
    return (hostname or "in-process").split("@", 1)[0]


@register("test-count")
class CountNode(Node):
    """Item `label` under params `key`: `RPUSH <key>:runs "<worker> <label>"` as it starts; then, while the key
    `<key>:hold:<worker>:<label>` exists, waits (a test holds one worker at one item); then `seconds` of work; then
    the side effect, counted: `HINCRBY <key>:effects <label> 1`. Writes `label`."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> str:
        redis, key, label, worker = client(), params["key"], str(params["label"]), worker_name()
        redis.rpush(f"{key}:runs", f"{worker} {label}")
        deadline = time.monotonic() + HOLD_LIMIT
        while redis.exists(f"{key}:hold:{worker}:{label}") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(float(params.get("seconds", 0)))
        redis.hincrby(f"{key}:effects", label, 1)
        return label

    def post(self, shared: Any, prep_res: Any, exec_res: str) -> str:
        shared["label"] = exec_res
        return "default"
