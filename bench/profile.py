"""Where the time goes: cProfile of the scheduler process, and the local per-item cost layer by layer.

Used by `python -m bench` for its diagnostics section (extra runs, never the timed ones), and
standalone: `python -m bench.profile [--n 10000] [--top 15]` prints the full cProfile tables of one
chordflow celery run on a fresh bench cluster.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import variants
from bench.measure import log

# (label, file suffix, function name): the scheduler-side steps of one celery batch worth naming.
FOCUS = (
    ("scheduler.run (total)", "scheduler/engine.py", "run"),
    ("CeleryBackend.run_batch", "scheduler/backends/celery.py", "run_batch"),
    ("  chunking.worker_processes (inspect broadcast)", "scheduler/chunking.py", "worker_processes"),
    ("  snapshot.encode (snapshot + item slices)", "ir/snapshot.py", "encode"),
    ("  chord(header)(body): publish the chunk messages", "celery/canvas.py", "__call__"),
    ("  CeleryBackend._wait (progress loop until ready)", "scheduler/backends/celery.py", "_wait"),
    ("    RunState.read_progress (XREAD block=200ms)", "worker/runstate.py", "read_progress"),
    ("    AsyncResult.ready (chord body state)", "celery/result.py", "ready"),
    ("    RunState.cancelled (EXISTS per wake-up)", "worker/runstate.py", "cancelled"),
    ("  snapshot.decode (aggregate from the result backend)", "ir/snapshot.py", "decode"),
    ("  BatchResult.from_wire", "worker/aggregate.py", "from_wire"),
)


def profile_call(call: Callable[[], Any]) -> tuple[float, pstats.Stats]:
    profiler = cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    try:
        call()
    finally:
        profiler.disable()
    return time.perf_counter() - t0, pstats.Stats(profiler)


def focus_rows(stats: pstats.Stats) -> list[tuple[str, int, float, float]]:
    """(label, calls, own time, cumulative time) for the FOCUS functions present in the profile."""
    rows = []
    table = stats.stats  # type: ignore[attr-defined]
    for label, suffix, name in FOCUS:
        calls, own, cum = 0, 0.0, 0.0
        for (filename, _line, func), (_cc, nc, tt, ct, _callers) in table.items():
            if func == name and filename.endswith(suffix):
                calls, own, cum = calls + nc, own + tt, max(cum, ct)
        if calls:
            rows.append((label, calls, own, cum))
    return rows


def top_rows(stats: pstats.Stats, limit: int) -> list[tuple[str, int, float, float]]:
    """The functions with the most own (internal) time."""
    table = stats.stats  # type: ignore[attr-defined]
    ranked = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:limit]
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in ranked:
        where = filename.split("site-packages/")[-1].replace(str(Path.cwd()) + "/", "")
        rows.append((f"{where}:{line}({func})" if line else func, nc, tt, ct))
    return rows


def profile_chordflow(n: int, top: int = 10) -> dict[str, Any]:
    """One extra chordflow celery run of `n` items under cProfile (slower than the timed runs)."""
    items = list(range(n))
    seconds, stats = profile_call(lambda: variants.run_chordflow(items, "celery"))
    return {"n": n, "seconds": seconds, "focus": focus_rows(stats), "top": top_rows(stats, top)}


# -- issue 2: the local per-item cost, layer by layer ------------------------------------------------
def _best(call: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best


def local_layers(n: int, repeats: int = 3) -> list[tuple[str, float]]:
    """Best-of-`repeats` seconds for `n` items, each row adding one layer of the local path.

    Built with chordflow's own building blocks (read-only use): the item chain the compiler builds,
    `PflowBatchNode.run_item`, the in-process loop with its fail-fast hook, the merge, the full run.
    """
    from scheduler.compiler import load
    from worker.aggregate import summarize
    from worker.build import batch_node, item_chain
    from worker.executor import FailFast, run_in_process, run_items

    items = list(range(n))
    shared = {"items": items}
    spec = load(variants.WORKFLOW).nodes[0]
    node_id, alias = spec.id, spec.batch.alias

    def chain_loop() -> None:
        chain = item_chain(spec)
        for index, item in enumerate(items):
            s = dict(shared)
            s[node_id] = {}
            s[alias] = item
            s["__index__"] = index
            chain._run(s)

    def batch_node_bound() -> Any:
        node = batch_node(spec)
        node.bind(shared)
        return node

    def run_item_loop() -> None:
        node = batch_node_bound()
        run_item = node.run_item
        for index, item in enumerate(items):
            run_item(index, item)

    def run_items_bare() -> None:
        run_items(batch_node_bound(), enumerate(items), [])

    def in_process() -> None:
        run_in_process(batch_node_bound(), items, [FailFast()])

    def in_process_merge() -> None:
        summarize(run_in_process(batch_node_bound(), items, [FailFast()]), n, True)

    def full_run() -> None:
        variants.run_chordflow(items, "local")

    layers = [
        ("plain loop: dict(shared) + 2 keys, NoopNode()._run(s)", lambda: variants.plain_loop(items, shared)),
        ("+ wrapper chain NamespacedNode > TemplateNode > NoopNode (+ __index__ key)", chain_loop),
        ("+ PflowBatchNode.run_item: Node._exec retry loop, exec copy, ItemOutcome, failure_of", run_item_loop),
        ("+ executor.run_items list (no middleware)", run_items_bare),
        ("+ run_in_process with the FailFast middleware (what backend=local runs)", in_process),
        ("+ aggregate.summarize (order + results/count/errors)", in_process_merge),
        ("scheduler.run(backend='local') (+ load, compile, post, events)", full_run),
    ]
    return [(label, _best(call, repeats)) for label, call in layers]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("--n", type=int, default=10_000, help="items in the profiled chordflow celery run")
    parser.add_argument("--top", type=int, default=25, help="rows of each cProfile table")
    parser.add_argument("--local", action="store_true", help="also print the local per-item layer breakdown")
    args = parser.parse_args(argv)
    from bench import cluster as bench_cluster

    workdir = Path(tempfile.mkdtemp(prefix="chordflow-profile-"))
    bench = bench_cluster.start(workdir)
    try:
        variants.run_chordflow(list(range(200)), "celery")  # warm-up: connections, worker caches
        profiler = cProfile.Profile()
        items = list(range(args.n))
        profiler.enable()
        variants.run_chordflow(items, "celery")
        profiler.disable()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(args.top)
        stats.sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
        for label, calls, own, cum in focus_rows(stats):
            print(f"{label:60s} calls={calls:6d} own={own * 1000:8.1f} ms cum={cum * 1000:8.1f} ms")
        if args.local:
            for label, seconds in local_layers(100_000):
                print(f"{seconds / 100_000 * 1e6:7.3f} us/item  {label}")
    finally:
        bench.stop()
    log(f"worker and redis logs kept in {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
