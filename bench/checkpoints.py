"""`python -m bench.checkpoints`: what a checkpoint after every node costs, on the embedded store and on Redis.

Three figures: one checkpoint after a node that changed one small key, with an empty
store and with a 100 MB store beside it (it must cost the same); and a local run of 10,000 small node
executions (a loop of one node) with checkpoints, against the same stepper loop with none. And what a local
batch pays for keeping its outcomes as it runs (worker/batch/checkpoints.py): a batch of small
`echo` items through LocalBackend keeping them in the embedded store, against the same batch keeping none.
Writes bench/CHECKPOINTS.md (or --out).

Internal modules it uses beyond the public API: `worker.batch.backend`, `worker.cluster.state.runs`,
`worker.engine.build`, `worker.engine.context`, `worker.engine.loader`, `worker.engine.stepper`,
`worker.engine.steps`, `worker.runs.record`, `worker.runs.sqlite`.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from bench import harness
from bench.harness import BenchCluster, Session, log


@dataclass(frozen=True)
class Sizes:
    repeats: int  # checkpoints timed beside an empty store (a quarter of that beside the big one)
    big_mb: int  # the big store value
    steps: int  # node executions in the loop
    items: int  # items of the batch


FULL = Sizes(repeats=2000, big_mb=100, steps=10_000, items=1_000_000)
QUICK = Sizes(repeats=200, big_mb=10, steps=500, items=20_000)


def main(argv: list[str] | None = None) -> int:
    args = harness.arguments("bench.checkpoints", __doc__, "CHECKPOINTS.md", f"small sizes: {QUICK}", argv)
    harness.run_bench(args, measure, report, workers=())  # a redis-server, no workers
    return 0


def loop_workflow(steps: int) -> dict[str, Any]:
    """`count` runs `steps` times: it returns "again" until its counter reaches `rounds`."""
    return {
        "max_steps": steps + 10,
        "nodes": [{"id": "count", "type": "bench-rounds", "params": {"rounds": steps}}],
        "edges": [{"from": "count", "to": "count", "action": "again"}],
    }


def register_rounds() -> None:
    """The smallest node that loops: one counter in its namespace."""
    from pocketflow import Node

    from worker.nodes import register

    @register("bench-rounds")
    class Rounds(Node):
        def prep(self, shared: Any) -> int:
            return int(shared.get("n", 0)) + 1

        def post(self, shared: Any, prep_res: int, exec_res: Any) -> str:
            shared["n"] = prep_res
            return "again" if prep_res < int(self.params["rounds"]) else "done"


def median_checkpoint(runs: Any, store_bytes: int, repeats: int) -> float:
    """Median seconds of one `runs.checkpoint` of one small changed key, beside `store_bytes` of data."""
    from worker.engine.steps import Step
    from worker.runs.record import RunRecord

    run_id = f"r{store_bytes}"  # one run per measurement: the Redis one shares its server
    store = {"big": "x" * store_bytes} if store_bytes else {}
    runs.create(RunRecord(run_id, {"nodes": []}, "local", "running", "n"), store)
    samples = []
    for step in range(repeats):
        result = Step("n", "default", "n", {"n": {"value": step}}, [])
        started = time.perf_counter()
        runs.checkpoint(run_id, step, result)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def loop_run(steps: int, checkpoints: bool) -> float:
    import scheduler
    from worker.engine.context import RunContext
    from worker.engine.stepper import drive
    from worker.engine.steps import Cursor

    flow = scheduler.compile(loop_workflow(steps))
    started = time.perf_counter()
    if checkpoints:
        result = scheduler.run(flow.workflow)
        assert result.status == "success", result.error
    else:
        drive(flow, Cursor(flow.start_id), {}, RunContext())
    return time.perf_counter() - started


def batch_run(count: int, runs: Any = None) -> float:
    """A batch of `count` echo items through LocalBackend, its outcomes kept in `runs` as it goes (None: not)."""
    from worker.batch.backend import BatchJob, LocalBackend
    from worker.engine.build import item_chain
    from worker.engine.loader import load

    wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}
    spec = load(wf).nodes[0]
    items = list(range(count))
    keep = None if runs is None else (lambda job, chunks, counts: runs.save_chunks("bench", job.key, chunks, counts))
    started = time.perf_counter()
    result = LocalBackend(keep=keep).run_batch(BatchJob(spec, items, {"items": items}, item_chain(spec), "b#0"))
    elapsed = time.perf_counter() - started
    assert result.aggregate is not None and result.aggregate["count"] == count
    return elapsed


def measure(session: Session, bench: BenchCluster) -> dict[str, Any]:
    """SQLite (worker/runs/sqlite.py, a fresh file each) and Redis (worker/cluster/state/runs.py, one Lua
    script per checkpoint, on the bench's own redis-server); then the loop, best of 3 each way."""
    from worker.cluster.state.runs import ClusterRuns
    from worker.runs.sqlite import LocalRuns

    sizes = QUICK if session.quick else FULL
    register_rounds()
    big = sizes.big_mb * 2**20
    out: dict[str, Any] = {"sizes": sizes}
    for name, store_bytes, repeats in (("empty", 0, sizes.repeats), ("big", big, sizes.repeats // 4)):
        sqlite = LocalRuns(session.workdir / f"runs-{name}.db")
        out[name] = median_checkpoint(sqlite, store_bytes, repeats)
        out[f"redis_{name}"] = median_checkpoint(ClusterRuns(bench.redis, ttl=600), store_bytes, repeats)
        log(
            f"checkpoint beside {store_bytes:,} bytes: {out[name] * 1e3:.3f} ms, Redis {out[f'redis_{name}'] * 1e3:.3f}"
        )
    out["plain"] = min(loop_run(sizes.steps, False) for _ in range(3))
    out["recorded"] = min(loop_run(sizes.steps, True) for _ in range(3))
    log(f"loop of {sizes.steps:,} steps: {out['plain']:.3f} s plain, {out['recorded']:.3f} s with checkpoints")
    out["batch_plain"] = min(batch_run(sizes.items) for _ in range(3))
    out["batch_kept"] = min(batch_run(sizes.items, LocalRuns(session.workdir / "runs-batch.db")) for _ in range(3))
    log(f"batch of {sizes.items:,} items: {out['batch_plain']:.3f} s, {out['batch_kept']:.3f} s keeping outcomes")
    return out


def report(session: Session, r: dict[str, Any]) -> str:
    sizes: Sizes = r["sizes"]
    per_node = (r["recorded"] - r["plain"]) / sizes.steps
    rows = [
        ("one checkpoint, one small key changed, empty store", f"{r['empty'] * 1e3:.3f} ms", "0.2 ms"),
        (f"the same beside a {sizes.big_mb} MB store value", f"{r['big'] * 1e3:.3f} ms", "same as empty"),
        (
            "one checkpoint on Redis (loopback, own redis-server), empty store",
            f"{r['redis_empty'] * 1e3:.3f} ms",
            "1 ms",
        ),
        (
            f"the same on Redis beside a {sizes.big_mb} MB store value",
            f"{r['redis_big'] * 1e3:.3f} ms",
            "same as empty",
        ),
        (f"loop of {sizes.steps:,} node executions, no checkpoints (`drive`)", f"{r['plain']:.3f} s", ""),
        ("the same through `scheduler.run` (record + checkpoint per node)", f"{r['recorded']:.3f} s", ""),
        ("added per node execution", f"{per_node * 1e3:.3f} ms", ""),
        (f"local batch of {sizes.items:,} `echo` items, outcomes not kept", f"{r['batch_plain']:.3f} s", ""),
        (
            "the same keeping its outcomes as it runs (a chunk every 0.5 s)",
            f"{r['batch_kept']:.3f} s (+{(r['batch_kept'] / r['batch_plain'] - 1) * 100:.0f}%)",
            "",
        ),
    ]
    body = f"""{harness.table(("measurement", "result", "target"), rows)}

A checkpoint writes only the top-level keys the node changed (found by identity, not by reading
values), so its cost does not depend on the size of the rest of the store. Each figure is the median of
{sizes.repeats:,} checkpoints ({sizes.repeats // 4:,} beside the big value); each loop the best of 3."""
    return harness.document(session, "Checkpoint cost (embedded store and Redis)", body)


if __name__ == "__main__":
    raise SystemExit(main())
