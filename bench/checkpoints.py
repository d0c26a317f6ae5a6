"""`python -m bench.checkpoints`: what a checkpoint after every node costs on the embedded store.

Three figures (issue 7, item 2): one checkpoint after a node that changed one small key, with an empty
store and with a 100 MB store beside it (it must cost the same); and a local run of 10,000 small node
executions (a loop of echo nodes) with checkpoints, against the same stepper loop with none.
Writes bench/CHECKPOINTS.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LOOP_STEPS = 10_000


def loop_workflow(steps: int) -> dict[str, Any]:
    """`count` runs `steps` times: it returns "again" until its counter reaches `rounds`."""
    return {
        "max_steps": steps + 10,
        "nodes": [{"id": "count", "type": "bench-rounds", "params": {"rounds": steps}}],
        "edges": [{"from": "count", "to": "count", "action": "again"}],
    }


def median_checkpoint(runs: Any, store_bytes: int, repeats: int) -> float:
    """Median seconds of one `runs.checkpoint` of one small changed key, beside `store_bytes` of data."""
    from worker.engine.stepper import Step
    from worker.runs.record import RunRecord

    store = {"big": "x" * store_bytes} if store_bytes else {}
    runs.create(RunRecord("r", {"nodes": []}, "local", "running", "n"), store)
    samples = []
    for step in range(repeats):
        result = Step("n", "default", "n", {"n": {"value": step}}, [])
        started = time.perf_counter()
        runs.checkpoint("r", step, result)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def checkpoint_cost(store_bytes: int, repeats: int = 2000) -> float:
    """On the embedded store (worker/runs/sqlite.py), in a fresh SQLite file."""
    from worker.runs.sqlite import LocalRuns

    return median_checkpoint(LocalRuns(Path(tempfile.mkdtemp()) / "runs.db"), store_bytes, repeats)


def redis_checkpoint_cost(store_bytes: int, repeats: int = 2000) -> float:
    """On Redis (worker/cluster/state/runs.py, one Lua script per checkpoint), on a bench-owned server."""
    import redis

    from scheduler.localcluster import RedisServer
    from worker.cluster.state.runs import ClusterRuns

    server = RedisServer(Path(tempfile.mkdtemp()))
    try:
        return median_checkpoint(ClusterRuns(redis.Redis.from_url(server.url), ttl=600), store_bytes, repeats)
    finally:
        server.kill()


def loop_run(steps: int, checkpoints: bool) -> float:
    import scheduler
    from worker.engine.context import RunContext
    from worker.engine.stepper import Cursor, drive

    flow = scheduler.compile(loop_workflow(steps))
    started = time.perf_counter()
    if checkpoints:
        result = scheduler.run(flow.workflow)
        assert result.status == "success", result.error
    else:
        drive(flow, Cursor(flow.start_id), {}, RunContext())
    return time.perf_counter() - started


def main() -> None:
    os.environ["CHORDFLOW_HOME"] = tempfile.mkdtemp(prefix="chordflow-bench-")
    from pocketflow import Node

    from worker.nodes import register

    @register("bench-rounds")
    class Rounds(Node):  # the smallest node that loops: one counter in its namespace
        def prep(self, shared: Any) -> int:
            return int(shared.get("n", 0)) + 1

        def post(self, shared: Any, prep_res: int, exec_res: Any) -> str:
            shared["n"] = prep_res
            return "again" if prep_res < int(self.params["rounds"]) else "done"

    empty = checkpoint_cost(0)
    big = checkpoint_cost(100 * 1024 * 1024, repeats=500)
    redis_empty = redis_checkpoint_cost(0)
    redis_big = redis_checkpoint_cost(100 * 1024 * 1024, repeats=500)
    plain = min(loop_run(LOOP_STEPS, False) for _ in range(3))
    recorded = min(loop_run(LOOP_STEPS, True) for _ in range(3))
    per_node = (recorded - plain) / LOOP_STEPS
    text = f"""# Checkpoint cost (embedded store and Redis)

`python -m bench.checkpoints` ({time.strftime("%Y-%m-%d")}, Python {sys.version.split()[0]}, {os.cpu_count()} cores).

| measurement | result | target |
|---|---|---|
| one checkpoint, one small key changed, empty store | {empty * 1e3:.3f} ms | 0.2 ms |
| the same beside a 100 MB store value | {big * 1e3:.3f} ms | same as empty |
| one checkpoint on Redis (loopback, own redis-server), empty store | {redis_empty * 1e3:.3f} ms | 1 ms |
| the same on Redis beside a 100 MB store value | {redis_big * 1e3:.3f} ms | same as empty |
| loop of {LOOP_STEPS:,} node executions, no checkpoints (`drive`) | {plain:.3f} s | |
| the same through `scheduler.run` (record + checkpoint per node) | {recorded:.3f} s | |
| added per node execution | {per_node * 1e3:.3f} ms | |

A checkpoint writes only the top-level keys the node changed (found by identity, not by reading
values), so its cost does not depend on the size of the rest of the store.
"""
    (HERE / "CHECKPOINTS.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
