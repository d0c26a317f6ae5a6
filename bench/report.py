"""RESULTS.md (tables, ratios against the targets, machine facts, diagnostics) and throughput.png.

Internal modules it uses beyond the public API: `scheduler.backends.celery`, `worker.settings`."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import harness, variants
from bench.harness import Session, document, verdict

if TYPE_CHECKING:
    from bench.run import Record, Results

LETTER = {variants.NAIVE: "(a)", variants.CHUNKED: "(b)", variants.CELERY: "(c)", variants.LOCAL: "(d)"}
COLORS = {variants.NAIVE: "#d62728", variants.CHUNKED: "#1f77b4", variants.CELERY: "#2ca02c", variants.LOCAL: "#9467bd"}


def _mb(n: int | float | None) -> str:
    return "" if n is None else f"{n / 1e6:,.2f}"


def _n(n: int) -> str:
    return f"{n // 1000:,}k" if n % 1000 == 0 and n < 1_000_000 else f"{n:,}"


def _ms(value: Any) -> str:
    return "" if value is None else f"{value:,.0f}"


def ratios(results: Results) -> list[tuple[str, str, str, bool | None]]:
    """(check, measured, target, ok) rows."""
    rows: list[tuple[str, str, str, bool | None]] = []
    ns = sorted({r.n for r in results.records})
    for n in ns:
        b, c = results.get(variants.CHUNKED, n), results.get(variants.CELERY, n)
        if b and c:
            ratio = c.best.seconds / b.best.seconds
            rows.append((f"(c)/(b) per item, N={_n(n)}", f"{ratio:.2f}", "<= 1.5", ratio <= 1.5))
    for n in ns:
        a, c = results.get(variants.NAIVE, n), results.get(variants.CELERY, n)
        if a and c:
            ratio = a.best.seconds / c.best.seconds
            rows.append((f"(a)/(c) per item, N={_n(n)}", f"{ratio:.1f}", ">= 10", ratio >= 10))
    c10, c100 = results.get(variants.CELERY, 10_000), results.get(variants.CELERY, 100_000)
    if c10 and c100:
        ratio = c100.best.seconds / c10.best.seconds
        rows.append(("(c) time N=100k / N=10k", f"{ratio:.2f}", "<= 11", ratio <= 11))
    else:
        rows.append(("(c) time N=100k / N=10k", "not measured (--quick)", "<= 11", None))
    m = results.million
    if m is not None:
        ok = bool(m.samples)
        value = f"{m.best.seconds:.1f} s ({m.best.seconds / m.n * 1e6:.1f} us/item)" if ok else f"failed: {m.error}"
        rows.append(("(c) 1,000,000 no-op items finishes", value, "finishes", ok))
    else:
        rows.append(("(c) 1,000,000 no-op items finishes", "skipped (--quick)", "finishes", None))
    snap = results.snapshot
    if snap.get("bytes_in") is not None:
        ok = snap["bytes_in"] <= snap["budget"]
        value = f"{_mb(snap['bytes_in'])} MB written"
        target = f"<= 3 MB + items ({_mb(snap['items_bytes'])} MB) = {_mb(snap['budget'])} MB"
        rows.append(("large snapshot (1 MB value, 10k items): bytes into Redis", value, target, ok))
    per_item = results.per_item
    if per_item:
        keeping, discarding = per_item_ratios(per_item)
        check = "local per-item cost / plain NoopNode loop keeping results, N=100k"
        value = f"{keeping:.2f}x ({discarding:.2f}x against the loop that discards results)"
        rows.append((check, value, "<= 3x", keeping <= 3))
    return rows


def per_item_ratios(per_item: dict[str, Any]) -> tuple[float, float]:
    """local / plain loop keeping results (the judged one), local / plain loop discarding them."""
    best = per_item["best"]
    return best["local"] / best["plain"], best["local"] / best["discarding"]


RESULTS_HEAD = ("variant", "N", "runs", "wall s (best)", "all runs s", "us/item", "items/s")
RESULTS_HEAD += ("scheduler peak RSS + MB", "Redis bytes in MB", "tasks")
PHASES_HEAD = ("variant", "N", "wall ms", "first task received", "all header tasks done", "chord body done")
PHASES_HEAD += ("body done -> caller returned", "worker busy s (sum, 2 procs)", "body task s", "registry read")


def results_table(results: Results) -> str:
    """Every record, by variant and N, the 1,000,000-item one last."""
    records = sorted(results.records, key=lambda r: (variants.VARIANTS.index(r.variant), r.n))
    rows = []
    for r in records + ([results.million] if results.million is not None else []):
        name = f"{LETTER[r.variant]} {r.variant}"
        if not r.samples:
            rows.append([name, _n(r.n), 0, f"FAILED: {r.error}", *[""] * 6])
            continue
        best = r.best
        runs = ", ".join(f"{s.seconds:.3f}" for s in r.samples)
        tasks = best.phases.get("tasks", "") if best.phases else ""
        row = [name, _n(r.n), len(r.samples), f"{best.seconds:.3f}", runs, f"{best.seconds / r.n * 1e6:,.2f}"]
        rows.append([*row, f"{r.n / best.seconds:,.0f}", f"{r.rss / 2**20:,.1f}", _mb(best.bytes_in), tasks])
    return harness.table(RESULTS_HEAD, rows, "lrrrlrrrrr")


def phases_table(results: Results) -> str:
    """The best run of every Celery record, by N and variant."""
    timed = results.records + ([results.million] if results.million is not None else [])
    records = [r for r in timed if r.variant != variants.LOCAL and r.samples and r.best.phases]
    rows = []
    for r in sorted(records, key=lambda r: (r.n, variants.VARIANTS.index(r.variant))):
        best, p = r.best, r.best.phases
        inspect = best.extra.get("inspect")
        row = [f"{LETTER[r.variant]} {r.variant}", _n(r.n), f"{best.seconds * 1000:,.0f}", _ms(p["to_first_ms"])]
        row += [_ms(p["headers_done_ms"]), _ms(p["body_done_ms"]), _ms(p["notice_ms"]), f"{p['busy_s']:.3f}"]
        rows.append([*row, f"{p['body_s']:.3f}", "" if inspect is None else ("yes" if inspect else "no")])
    return harness.table(PHASES_HEAD, rows, "lrrrrrrrrl")


def notice_summary(results: Results) -> list[str]:
    """Median 'chord body done -> caller returned' per Celery variant, over every timed run."""
    lines = []
    for variant in (variants.NAIVE, variants.CHUNKED, variants.CELERY):
        values = [
            s.phases["notice_ms"]
            for r in results.records
            if r.variant == variant
            for s in r.samples
            if s.phases.get("notice_ms") is not None
        ]
        if values:
            lines.append(
                f"- {LETTER[variant]} {variant}: chord body finished -> caller returned: median "
                f"{statistics.median(values):,.0f} ms, min {min(values):,.0f}, max {max(values):,.0f} "
                f"(over {len(values)} runs)"
            )
    return lines


def profile_section(results: Results) -> list[str]:
    lines: list[str] = []
    for prof in results.profiles:
        lines += [
            "",
            f"**cProfile of one extra (c) run, N={_n(prof['n'])}** (scheduler process, {prof['seconds']:.3f} s "
            "under the profiler):",
            "",
            "| step | calls | own ms | cumulative ms |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {label} | {calls} | {own * 1000:,.1f} | {cum * 1000:,.1f} |" for label, calls, own, cum in prof["focus"]
        ]
        lines += ["", "Top own time:", "", "| function | calls | own ms | cumulative ms |", "|---|---:|---:|---:|"]
        lines += [
            f"| `{name}` | {calls} | {own * 1000:,.1f} | {cum * 1000:,.1f} |" for name, calls, own, cum in prof["top"]
        ]
    return lines


def per_item_section(results: Results) -> list[str]:
    per_item = results.per_item
    if not per_item:
        return []
    n, best, runs = per_item["n"], per_item["best"], per_item["runs"]
    keeping, discarding = per_item_ratios(per_item)
    rows = (
        ("chordflow local", "local"),
        ("plain loop keeping results: `...; node._run(s); results.append(s['b'])`", "plain"),
        ("plain loop discarding results: the same without `results.append`", "discarding"),
    )
    lines = [
        f"`scheduler.run(workflow, {{'items': items}}, backend='local')` with {n:,} no-op items vs a plain loop "
        "`s = dict(shared); s['b'] = {}; s['item'] = item; node._run(s); results.append(s['b'])` over the same "
        "`NoopNode`, and the same loop without `results.append` (best of 3 each):",
        "",
        "| | best s | runs s | us/item |",
        "|---|---:|---|---:|",
    ]
    lines += [
        f"| {label} | {best[key]:.4f} | {', '.join(f'{s:.4f}' for s in runs[key])} | {best[key] / n * 1e6:.2f} |"
        for label, key in rows
    ]
    lines += [
        "",
        f"Ratio against the loop keeping results (a batch must return them): **{keeping:.2f}x** (target <= 3x: "
        f"{verdict(keeping <= 3)}). Against the loop that discards every result: {discarding:.2f}x (not the "
        "target's baseline: that loop does less work than any batch can).",
        "",
        "Where the local per-item time goes, one layer added per row (each best of 3, same items; *GC off* = "
        "the same with the cyclic garbage collector disabled; *calls/item* = Python function calls per item "
        "counted by cProfile):",
        "",
        "| layer | us/item | added | us/item, GC off | added, GC off | calls/item |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    layers = per_item["layers"]
    prev_on = prev_off = None
    for label, on, off, calls, note in layers["rows"]:
        if on is None:
            lines.append(f"| {label} | {note} | | | | |")
            continue
        on_us, off_us = on / n * 1e6, off / n * 1e6
        add_on = "" if prev_on is None else f"{on_us - prev_on:+.2f}"
        add_off = "" if prev_off is None else f"{off_us - prev_off:+.2f}"
        lines.append(f"| {label} | {on_us:.2f} | {add_on} | {off_us:.2f} | {add_off} | {calls:.1f} |")
        prev_on, prev_off = on_us, off_us
    gcs = layers["gc"]
    lines += [
        "",
        f"Cyclic GC collections during one full local run of {n:,} items: generation 0: {gcs.get(0, 0)}, "
        f"1: {gcs.get(1, 0)}, 2: {gcs.get(2, 0)} (thresholds {layers['gc_threshold']}).",
    ]
    return lines


def snapshot_section(results: Results) -> list[str]:
    snap = results.snapshot
    if not snap:
        return []
    record: Record = snap["record"]
    lines = [
        f"(c) with inputs `{{'items': items, 'blob': 'x' * 1_000_000}}`, {_n(record.n)} items; bytes written to the "
        "bench's redis-server = delta of `INFO stats total_net_input_bytes` around the call (everything every "
        "client sent: the scheduler's SET/LPUSH/XREAD..., the workers' results, progress, acks and events).",
        "",
        "| quantity | bytes |",
        "|---|---:|",
        f"| measured: bytes into Redis during the run (max of {len(record.samples)} runs) | {snap['bytes_in']:,} |",
        f"| the items' own encoded size (msgpack of the 10k-item list) | {snap['items_bytes']:,} |",
        f"| the encoded snapshot (the whole store: blob + items) | {snap['snapshot_bytes']:,} |",
        f"| budget: 3,000,000 + items | {snap['budget']:,} |",
    ]
    if snap.get("without_blob") is not None:
        lines.append(f"| same N without the blob ((c) N=10k row above) | {snap['without_blob']:,} |")
        extra = snap["bytes_in"] - snap["without_blob"]
        lines.append(f"| marginal bytes of the 1 MB value | {extra:,} |")
    if record.samples:
        lines += ["", f"Wall time: {', '.join(f'{s.seconds:.3f} s' for s in record.samples)}."]
    return lines


def write_plot(results: Results, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.2), dpi=120)
    for variant in variants.VARIANTS:
        points = sorted((r.n, r.n / r.best.seconds) for r in results.records if r.variant == variant and r.samples)
        if variant == variants.CELERY and results.million is not None and results.million.samples:
            points.append((results.million.n, results.million.n / results.million.best.seconds))
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=f"{LETTER[variant]} {variant}", color=COLORS[variant])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("items in the batch (N)")
    ax.set_ylabel("items/s (log)")
    ax.set_title("No-op batch throughput: 2 worker processes (2 solo workers), one redis-server")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


#: The benchmarks with results files of their own, named here so this page leads to every measured number.
OTHER_RESULTS = [
    "## Other results",
    "",
    "- `CHECKPOINTS.md` (`python -m bench.checkpoints`): the cost of a checkpoint after a node, SQLite and Redis,",
    "  beside an empty store and a 100 MB one, and of 10,000 small node executions with and without checkpoints.",
    "- `DURABLE.md` (`python -m bench.durable`): durable runs: 1-item latency against local, first vs warm run,",
    "  a 1,000,000-item batch through `submit` + `wait` (client, worker and Redis peak memory) and",
    "  `results --node` streaming it to a file.",
    "- `DATASETS.md` (`python -m bench.datasets`): dataset jobs (`submit --items`) of 1,000,000 and 100,000",
    "  records: wall time, client/worker/Redis memory, first result, `results --out`, against a stock Celery",
    "  `group` written by hand (bench/stock_group.py, no chordflow code) and the local backend.",
    "",
]


def render(session: Session, results: Results) -> str:
    """RESULTS.md; throughput.png is written beside it."""
    from scheduler.backends import celery as celery_backend
    from worker import settings

    write_plot(results, session.args.out / "throughput.png")
    s = settings.load()
    mode = "quick: N=1k, 10k; no 1M run" if session.quick else "full"
    lines = [
        f"Every number below comes from this one run ({mode}), on one redis-server the bench started and two "
        "worker processes. Regenerate with `make bench`.",
        "",
        "## Setup",
    ]
    lines += [
        "",
        "- **Workers: two solo workers** (`-P solo -c 1` each = 2 worker processes), the same for every Celery "
        "variant; started by `scheduler.localcluster.Cluster` with `CHORDFLOW_PLUGINS=bench.raw_tasks`, and "
        "`inspect().registered()` confirmed both workers registered `bench.naive_item`, `bench.collect`, "
        "`bench.chunk`, `bench.concat` (and chordflow's tasks) before anything was timed.",
        "- Same Celery configuration (worker/app.py `config()`: msgpack, acks_late, prefetch 1, ordered chords, "
        "task events) for every Celery variant; the machine's Redis on 6379 is never used. The baselines' tasks "
        "are defined on worker/app.py's `app` (bench/raw_tasks.py) and run by the same workers; the bench "
        "dispatches and awaits them by name through a stock `Celery` client app built from that same `config()` "
        "(Celery's own RedisBackend: `.get()` waits on result pub/sub), which is what a raw-Celery user writes. "
        "`AsyncResult.get()` on chordflow's own app (it hung when this bench was first written; fixed since, see "
        f"README.md), re-checked at start with a task sent with a countdown: {results.get_check or 'not checked'}.",
        "- Items are the ints `0..N-1`; every item runs the same PocketFlow `NoopNode` "
        "(worker/nodes/echo.py) on `dict(shared)` plus the node namespace and the item.",
        "- (a) **naive per-item chord**: `chord([bench.naive_item.s(shared, item) for item in items])"
        "(bench.collect.s()).get()` (fresh `NoopNode` per task; returns the node's namespace dict).",
        f"- (b) **hand-chunked chord**: {results.chunks} chunks (4 per worker process) of `ceil(N/{results.chunks})` "
        "items, one `NoopNode` per chunk, body `bench.concat` concatenates in chunk order; `.get()`.",
        "- (c) **chordflow celery**: `scheduler.run({'nodes':[{'id':'b','type':'noop','batch':{'items':'${items}'}}]}, "
        f"{{'items': items}}, backend='celery')` (auto chunking: {s.chunks_per_process} chunks per worker process, "
        f"at most {s.max_chunk_size} items per chunk; snapshot inline up to {s.snapshot_inline_bytes:,} bytes).",
        "- (d) **chordflow local**: the same workflow with `backend='local'` (in this process, sequential).",
        "- The raw baselines send the store minus the item list as `shared` (here `{}`); chordflow's snapshot "
        "is the whole store, the item list included, as it is designed to.",
        "- **Wall time**: `time.perf_counter()` around the whole dispatch-and-wait (and the result check); best of 2 "
        "runs for N <= 10k, one run above. A warm-up of each variant (200 items) runs first and is not timed; "
        "`gc.collect()` runs before every timed call, and after each raw-Celery run the stock client's pending "
        "unsubscribe replies are read off its pub/sub socket (both outside the timing, so one run's leftovers "
        "are not charged to the next).",
        "- **Scheduler peak RSS +**: peak resident set of this (dispatching) process during the call minus its RSS "
        "just before (Linux `VmHWM` after resetting it through `/proc/self/clear_refs`; max over the runs).",
        "- **Redis bytes in**: delta of the bench redis-server's `INFO stats total_net_input_bytes` around the call.",
        "- **tasks**: header tasks that succeeded, counted in the workers' logs.",
        "",
        "## Results",
        "",
    ]
    lines += [results_table(results)]
    lines += ["", "![items/s vs N](throughput.png)", "", "## Targets", "", "| check | measured | target | result |"]
    lines += ["|---|---|---|---|"]
    lines += [f"| {check} | {value} | {target} | {verdict(ok)} |" for check, value, target, ok in ratios(results)]
    lines += ["", "## Large snapshot (bytes written to Redis)", ""]
    lines += snapshot_section(results)
    lines += ["", "## Local sequential per-item overhead", ""]
    lines += per_item_section(results)
    lines += [
        "",
        "## Where the time goes",
        "",
        "Phases of the best run of every Celery measurement, in ms after the dispatch started, from the workers' "
        "own log lines (`Task ... received` / `succeeded in`, millisecond timestamps on the same clock) and, for "
        "*chord body done*, the body result's `date_done` (when the worker stored it). "
        "*Worker busy* is the sum of the header tasks' run times over both workers; *registry read* says "
        "whether chordflow re-read the worker registry (its cached worker-process count) during that call.",
        "",
    ]
    lines += [phases_table(results)]
    lines += [""]
    lines += notice_summary(results)
    lines += [
        "",
        f"chordflow's POLL_MS (scheduler/backends/celery.py, the longest its wait loop blocks in one XREAD): "
        f"{getattr(celery_backend, 'POLL_MS', 'n/a')} ms.",
    ]
    lines += profile_section(results)
    lines += ["", "The analysis of these numbers (which targets are missed and why) is in README.md, *Findings*.", ""]
    lines += OTHER_RESULTS
    return document(session, "chordflow vs raw Celery: no-op batch benchmark", "\n".join(lines))
