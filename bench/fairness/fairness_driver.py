"""One scenario of bench/fairness.py, run against one source tree (the current one, or main's exported).

Imported as a top-level module (`fairness_driver`, with bench/ on PYTHONPATH after the tree under test) so the
same file drives both trees: it uses only what both have (scheduler.submit/wait/status, localcluster.Cluster),
and it is the workers' plugin too (CHORDFLOW_PLUGINS=fairness_driver) for its `bench-sleep` node type.

    python -m fairness_driver '{"scenario": "small", "big": 1, "items": 60000, "priority": "high"}'

prints one JSON object: the small run's and each big run's time from submit to end (the run record's `created`
and `updated`, both written by the cluster), whether every big run has every index once in order, the load.

Internal modules it uses beyond the public API: `scheduler.localcluster`.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pocketflow import Node

from worker.nodes import register

#: The small run is submitted this long after the big ones (the issue's scenario).
SMALL_AFTER = 4.0


@register("bench-sleep")
class SleepNode(Node):
    """`seconds` of sleep per item (a stand-in for an item's I/O), writing its index."""

    def prep(self, shared: Any) -> tuple[float, Any]:
        return float(self.params.get("seconds", 0.001)), shared.get("__index__")

    def exec(self, prep_res: tuple[float, Any]) -> Any:
        time.sleep(prep_res[0])
        return prep_res[1]

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["i"] = exec_res
        return "default"


def batch(node_type: str, **params: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "b", "type": node_type, "params": params, "batch": {"items": "${items}"}}]}


def submit(wf: dict[str, Any], items: list[int], priority: str | None) -> str:
    import scheduler

    if priority is None:
        return scheduler.submit(wf, {"items": items})
    if "priority" not in inspect.signature(scheduler.submit).parameters:
        raise SystemExit("this tree has no priorities")
    return scheduler.submit(wf, {"items": items}, priority=priority)


def seconds(run_id: str) -> float:
    import scheduler

    info = scheduler.status(run_id)
    return round(float(info["updated"]) - float(info["created"]), 2)


def check(result: Any, count: int, ordered: bool) -> bool:
    """The run succeeded with `count` outcomes, each index once, in input order."""
    aggregate = result.shared["b"]
    if result.status != "success" or (aggregate["count"], aggregate["success_count"]) != (count, count):
        return False
    return not ordered or [r["i"] for r in aggregate["results"]] == list(range(count))


def scenario(spec: dict[str, Any]) -> dict[str, Any]:
    import scheduler

    items, noop = spec["items"], spec.get("noop", False)
    wf = batch("noop") if noop else batch("bench-sleep", seconds=0.001)
    began = time.monotonic()
    bigs = [submit(wf, list(range(items)), None) for _ in range(spec.get("big", 1))]
    out: dict[str, Any] = {"load_start": os.getloadavg()[0]}
    if spec["scenario"] == "small":
        time.sleep(max(0.0, SMALL_AFTER - (time.monotonic() - began)))  # the scenario: 4 s into the big batch
        small = submit(batch("bench-sleep", seconds=0.001), [0, 1, 2], spec.get("priority"))
        result = scheduler.wait(small, timeout=1800)
        out["small_ok"] = check(result, 3, True)
        out["small_s"] = seconds(small)
    results = [scheduler.wait(run_id, timeout=3600) for run_id in bigs]
    out["big_ok"] = all(check(r, items, not noop) for r in results)
    out["big_s"] = [seconds(run_id) for run_id in bigs]
    out["load_end"] = os.getloadavg()[0]
    return out


def main() -> None:
    from scheduler.localcluster import Cluster

    spec = json.loads(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="cf-fairness-") as tmp:
        cluster = Cluster(Path(tmp), plugins="fairness_driver")
        cluster.env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # the tree under test first, then bench/
        try:
            for name in ("w1", "w2"):
                cluster.start_worker(name)  # -P solo -c 1: two worker processes
            cluster.apply_env()
            print(json.dumps(scenario(spec)), flush=True)
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
