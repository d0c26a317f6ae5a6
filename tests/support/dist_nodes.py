"""Node types for the distributed tests. They run inside real worker processes, so whatever they
need to report goes through Redis (the cluster's server), never through module state."""

from __future__ import annotations

import threading
import time
from typing import Any

from pocketflow import Node

from worker.cluster.app import task
from worker.cluster.state.runstate import client
from worker.nodes import register

#: How long a party waits at a gate for the rest of its round: a worker of the suite's shared cluster may still be
#: finishing an earlier test's task, so this is generous; each BLPOP stays below the client's socket timeout (10 s).
GATE_WAIT_S, BLPOP_S = 60, 8


def meet(redis: Any, gate: str, parties: int) -> None:
    """A barrier in Redis: returns once `parties` arrivals of this round (one round per `parties` arrivals at
    `gate`) are inside; the last one of a round lets every party of the round through. Raises TimeoutError after
    GATE_WAIT_S."""
    arrived = redis.incr(gate)
    redis.expire(gate, 300)
    opened = f"{gate}:open:{(arrived - 1) // parties}"
    if arrived % parties == 0:
        redis.rpush(opened, *[1] * parties)
        redis.expire(opened, 300)
    deadline = time.monotonic() + GATE_WAIT_S
    while redis.blpop([opened], timeout=BLPOP_S) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gate {gate}: {parties} items never ran together")


@register("test-slow")
class SlowNode(Node):
    """Simulates `seconds` of work per item (real work, not synchronization); writes its index."""

    def prep(self, shared: Any) -> tuple[float, Any]:
        return float(self.params.get("seconds", 0.001)), shared.get("__index__")

    def exec(self, prep_res: tuple[float, Any]) -> Any:
        time.sleep(prep_res[0])
        return prep_res[1]

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["index"] = exec_res
        return "default"


@register("test-gauge")
class GaugeNode(Node):
    """Counts items in flight cluster-wide in Redis and records the highest count seen."""

    SCRIPT = """
    local now = redis.call('INCR', KEYS[1])
    local top = tonumber(redis.call('GET', KEYS[2]) or '0')
    if now > top then redis.call('SET', KEYS[2], now) end
    return now
    """

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> int:
        redis = client()
        key = params["key"]
        try:
            now = redis.eval(self.SCRIPT, 2, f"{key}:now", f"{key}:max")
            time.sleep(float(params.get("seconds", 0.02)))  # the item's work, overlapping other items
        finally:
            redis.decr(f"{key}:now")
        return int(now)

    def post(self, shared: Any, prep_res: Any, exec_res: int) -> str:
        shared["in_flight"] = exec_res
        return "default"


@register("test-gauge-gate")
class GaugeGateNode(Node):
    """test-gauge with a Redis barrier instead of a sleep: counts items in flight (`<key>:now`, the highest count
    in `<key>:max`) and holds each until `parties` items are inside together (key param `gate`, one round per
    `parties` arrivals), so that many provably overlap. Writes `value`, `in_flight` and `worker` (the Celery
    hostname: item threads of a parallel chunk must see the chunk's task). A round that never fills raises."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> int:
        redis, key, gate, parties = client(), params["key"], params["gate"], int(params["parties"])
        try:
            now = redis.eval(GaugeNode.SCRIPT, 2, f"{key}:now", f"{key}:max")
            meet(redis, gate, parties)
        finally:
            redis.decr(f"{key}:now")
        return int(now)

    def post(self, shared: Any, prep_res: dict[str, Any], exec_res: int) -> str:
        from celery import current_task

        shared["value"] = prep_res.get("value")
        shared["in_flight"] = exec_res
        shared["worker"] = current_task.request.hostname if current_task else "in-process"
        return "default"


@register("test-limiter")
class LimiterNode(Node):
    """Writes which rate limiter the item sees (`limiter`: its type, `limiter_id`: its id) and its thread."""

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        from worker.engine import rate_limits

        limiter = rate_limits.current()
        shared["limiter"], shared["limiter_id"] = type(limiter).__name__, id(limiter)
        shared["thread"] = threading.get_ident()
        return "default"


@register("test-fail-together")
class FailTogetherNode(Node):
    """Raises ValueError(f"boom {value}"), but only once `parties` items are inside exec together: a barrier in
    Redis (key param `gate`, one round per `parties` arrivals), so items on different workers all run before
    any of them fails. A round that never fills raises TimeoutError instead."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, params: dict[str, Any]) -> None:
        meet(client(), params["gate"], int(params["parties"]))
        raise ValueError(f"boom {params['value']}")


class _Unimportable(Exception):
    pass


_Unimportable.__module__ = "chordflow_nowhere"
_Unimportable.__qualname__ = _Unimportable.__name__ = "WeirdError"


@register("test-raise-unimportable")
class RaiseUnimportableNode(Node):
    """Raises an exception whose type the scheduler cannot import."""

    def exec(self, prep_res: Any) -> None:
        raise _Unimportable("from a module the scheduler does not have")


@task(name="tests.add")
def add(a: int, b: int) -> int:
    """A plain Celery task on chordflow's app: other tasks keep Celery's usual result waiting."""
    return a + b


@register("test-worker-name")
class WorkerNameNode(Node):
    """Writes the Celery hostname of the worker that ran the item (`w1@host`)."""

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        from celery import current_task

        shared["worker"] = current_task.request.hostname if current_task else "in-process"
        return "default"


@register("test-unencodable")
class UnencodableNode(Node):
    """Writes a value the snapshot codec cannot encode: the chunk cannot send its outcomes back."""

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = object()
        return "default"
