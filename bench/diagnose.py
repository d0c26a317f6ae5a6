"""Where the time goes: cProfile of the scheduler process, and the local per-item cost layer by layer.

Used by `python -m bench` for its diagnostics section (extra runs, never the timed ones), and
standalone: `python -m bench.diagnose [--n 10000] [--top 15]` prints the full cProfile tables of one
chordflow celery run on a fresh bench cluster.

Internal modules it uses beyond the public API: `ir.snapshot`, `worker.batch.backend`, `worker.batch.executor`,
`worker.batch.middleware`, `worker.cluster.batches.tasks`, `worker.cluster.state.runstate`, `worker.engine.build`,
`worker.engine.loader`.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib
import inspect
import io
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness, raw_tasks, variants

#: (label, `module:qualified.name`): the scheduler-side steps of one celery batch worth naming, found by the
#: function's own code (so a module that moves keeps its row); a name that is no attribute (celery's many
#: `__call__`s) counts every function of that name in the module's file.
FOCUS = (
    ("scheduler.run (total)", "scheduler:run"),
    ("CeleryBackend.run_batch", "scheduler.backends.celery:CeleryBackend.run_batch"),
    (
        "  chunking.registered_processes (worker registry, cached)",
        "worker.cluster.batches.chunking:registered_processes",
    ),
    ("  snapshot.encode (snapshot + item slices)", "ir.snapshot:encode"),
    ("  chord(header)(body): publish the chunk messages", "celery.canvas:__call__"),
    ("  CeleryBackend._wait (until the batch is done)", "scheduler.backends.celery:CeleryBackend._wait"),
    (
        "    RunState.read_progress (XREAD, blocks up to POLL_MS)",
        "worker.cluster.state.runstate:RunState.read_progress",
    ),
    ("    CeleryBackend._emit_progress", "scheduler.backends.celery:CeleryBackend._emit_progress"),
    ("    AsyncResult.ready (chord state)", "celery.result:AsyncResult.ready"),
    ("    AsyncResult.failed", "celery.result:AsyncResult.failed"),
    ("    RunState.cancelled (EXISTS per wake-up)", "worker.cluster.state.runstate:RunState.cancelled"),
    ("    RunState.batch_result (GET the stored batch result)", "worker.cluster.state.runstate:RunState.batch_result"),
    ("  snapshot.decode (the batch result)", "ir.snapshot:decode"),
    ("  BatchResult.from_wire", "worker.batch.aggregate:BatchResult.from_wire"),
)


def code_of(target: str) -> tuple[str, str] | None:
    """(file, function name) of `module:qualified.name`; None when the module is gone."""
    module_name, _, qualname = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    code = getattr(inspect.unwrap(getattr(obj, "fget", obj)), "__code__", None) if obj is not None else None
    if code is not None:
        return code.co_filename, code.co_name
    return str(module.__file__), qualname.rpartition(".")[2]


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
    for label, target in FOCUS:
        where = code_of(target)
        calls, own, cum = 0, 0.0, 0.0
        for (filename, _line, func), (_cc, nc, tt, ct, _callers) in table.items():
            if where is not None and (filename, func) == where:
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


# -- the local per-item cost, layer by layer -------------------------------------------------------
def _best(call: Callable[[], Any], repeats: int, gc_off: bool = False) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        if gc_off:
            gc.disable()
        try:
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
        finally:
            gc.enable()
    return best


def gc_collections(call: Callable[[], Any]) -> dict[int, int]:
    """How many cyclic-GC collections of each generation run during `call()`."""
    counts = {0: 0, 1: 0, 2: 0}

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            counts[info["generation"]] = counts.get(info["generation"], 0) + 1

    gc.collect()
    gc.callbacks.append(count)
    try:
        call()
    finally:
        gc.callbacks.remove(count)
    return counts


def calls_per_item(call: Callable[[], Any], n: int) -> float:
    """Python-level function calls per item (cProfile's count over one run)."""
    _seconds, stats = profile_call(call)
    return stats.total_calls / n  # type: ignore[attr-defined]


def local_layers(n: int, repeats: int = 3) -> dict[str, Any]:
    """Rows of (label, best-of-`repeats` seconds with the GC on, the same with it off, Python calls per
    item, note) for `n` items, each row adding one layer; plus the GC collections of one full run.

    Built from chordflow's own building blocks (read-only use): the item chain the compiler builds,
    `ItemExecutor.run`, the per-item loop with the in-process hooks, the whole in-process batch
    (`LocalBackend.run_batch`: loop + merge), then the full `scheduler.run`. Internals move while
    others work: a layer whose API changed is reported as not measured instead of failing the bench.
    """
    from worker.batch.backend import BatchJob, LocalBackend
    from worker.batch.executor import ItemExecutor, run_items
    from worker.batch.middleware import item_middleware
    from worker.engine.build import item_chain
    from worker.engine.loader import load

    items = list(range(n))
    shared = {"items": items}
    spec = load(variants.WORKFLOW).nodes[0]
    node_id, alias = spec.id, spec.batch.alias

    def chain_loop() -> None:
        chain = item_chain(spec)
        results = []
        for index, item in enumerate(items):
            s = dict(shared)
            s[node_id] = {}
            s[alias] = item
            s["__index__"] = index
            chain._run(s)
            results.append(s[node_id])

    def run_item_loop() -> None:
        run_item = ItemExecutor(spec, item_chain(spec), shared).run
        results = []  # each item's result kept, as the executor keeps it (the ItemOutcome is dropped)
        for index, item in enumerate(items):
            results.append(run_item(index, item).result)

    def with_hooks() -> None:
        executor = ItemExecutor(spec, item_chain(spec), shared)
        run_items(executor, items, 0, item_middleware(node_id, n, spec.batch.fail_fast))

    def in_process_batch() -> None:
        LocalBackend().run_batch(BatchJob(spec, items, shared, item_chain(spec), f"{node_id}#0"))

    def full_run() -> None:
        variants.run_chordflow(items, "local")

    layers = [
        (
            "plain loop, results discarded: `dict(shared)` + 2 keys, `NoopNode()._run(s)`",
            lambda: variants.plain_loop_discarding(items, shared),
        ),
        ("+ keep each item's namespace in a list (the fair floor)", lambda: variants.plain_loop(items, shared)),
        ("+ wrapper chain NamespacedNode > TemplateNode > NoopNode (+ `__index__`)", chain_loop),
        ("+ `ItemExecutor.run` (retries, isolated copy, ItemOutcome, classify)", run_item_loop),
        ("+ `executor.run_items`: in-process hooks (`item_middleware`), columnar `ChunkResult`", with_hooks),
        ("+ merge: `LocalBackend.run_batch` (loop + `aggregate.merge`)", in_process_batch),
        ("`scheduler.run(backend='local')` (+ load, compile, post, events)", full_run),
    ]
    rows: list[tuple[str, float | None, float | None, float | None, str]] = []
    for label, call in layers:
        try:
            with_gc, without_gc = _best(call, repeats), _best(call, repeats, gc_off=True)
            rows.append((label, with_gc, without_gc, calls_per_item(call, n), ""))
        except Exception as exc:  # an internal API changed under us
            rows.append((label, None, None, None, f"not measured: {type(exc).__name__}: {exc}"))
    return {"rows": rows, "gc": gc_collections(full_run), "gc_threshold": gc.get_threshold()}


def chunk_cost(size: int = 5000, repeats: int = 5) -> tuple[float, float]:
    """us/item of one chunk's task body run in-process (no Celery): chordflow's run_chunk vs bench.chunk.

    Needs this process pointed at a Redis (run state); builds run_chunk's job by hand, mirroring
    scheduler/backends/celery.py (an internal format: may need updating when that changes).
    """
    from bench import raw_tasks
    from ir import snapshot
    from worker.cluster.batches import tasks
    from worker.cluster.state.runstate import RunState
    from worker.engine.loader import load

    items = list(range(size))
    state = RunState("bench-diagnose")
    ref = {"ref": state.store_snapshot(snapshot.encode({"items": items}))}
    job = {
        "run": "bench-diagnose",
        "batch": "b#diagnose",
        "node": load(variants.WORKFLOW).nodes[0].wire(),
        "snap": ref,
        "start": 0,
        "items": snapshot.encode(items),
    }
    chordflow = _best(lambda: tasks.run_chunk.run(job), repeats)
    raw = _best(lambda: raw_tasks.chunk.run({}, items), repeats)
    return chordflow / size * 1e6, raw / size * 1e6


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=10_000, help="items in the profiled chordflow celery run")
        parser.add_argument("--top", type=int, default=25, help="rows of each cProfile table")
        parser.add_argument("--local", action="store_true", help="also print the local per-item layer breakdown")
        parser.add_argument("--chunk", action="store_true", help="also time one 5,000-item chunk body in-process")

    quick = "1,000 items (and 10,000 for --local) instead of --n and 100,000"
    args = harness.arguments("bench.diagnose", __doc__, None, quick, argv, options)
    harness.run_bench(args, show, plugins=raw_tasks.__name__, needed=raw_tasks.TASK_NAMES)
    return 0


def show(session: harness.Session, bench: harness.BenchCluster) -> None:
    """Print the cProfile tables of one chordflow celery run, then the asked-for extras."""
    args = session.args
    variants.run_chordflow(list(range(200)), "celery")  # warm-up: connections, worker caches
    items = list(range(1_000 if args.quick else args.n))
    _seconds, stats = profile_call(lambda: variants.run_chordflow(items, "celery"))
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    for label, calls, own, cum in focus_rows(stats):
        print(f"{label:60s} calls={calls:6d} own={own * 1000:8.1f} ms cum={cum * 1000:8.1f} ms")
    if args.local:
        n = 10_000 if args.quick else 100_000
        layers = local_layers(n)
        for label, on, off, calls, note in layers["rows"]:
            if on is None:
                print(f"  n/a  {label} {note}")
                continue
            print(f"{on / n * 1e6:7.3f} us/item (GC off {off / n * 1e6:6.3f}, {calls:5.1f} calls/item)  {label}")
        print(f"GC collections during one full local run: {layers['gc']}")
    if args.chunk:
        try:
            cf, raw = chunk_cost()
            print(f"one 5,000-item chunk, in-process: chordflow.run_chunk {cf:.2f} us/item, bench.chunk {raw:.2f}")
        except Exception as exc:  # run_chunk's job format moved
            print(f"chunk cost not measured: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    raise SystemExit(main())
