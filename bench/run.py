"""`python -m bench`: every variant measured in one run, on one bench-owned redis-server and two workers.

Writes RESULTS.md and throughput.png into --out (default: this directory). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import cluster as bench_cluster
from bench import diagnose, report, variants
from bench.measure import Sample, log, measure
from ir import snapshot

HERE = Path(__file__).resolve().parent
FULL_NS = (1_000, 2_000, 10_000, 100_000)
QUICK_NS = (1_000, 10_000)
NAIVE_NS = (1_000, 2_000)  # the per-item chord is superlinear: capped at 2,000 items
MILLION = 1_000_000
SNAPSHOT_ITEMS = 10_000
BLOB_BYTES = 1_000_000
SNAPSHOT_BUDGET = 3_000_000  # bytes, plus the items' own encoded size
ISSUE2_N = 100_000
WARMUP_N = 200


@dataclass
class Record:
    variant: str
    n: int
    samples: list[Sample] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def best(self) -> Sample | None:
        return min(self.samples, key=lambda s: s.seconds) if self.samples else None

    @property
    def rss(self) -> int:
        return max((s.rss_increase for s in self.samples), default=0)


@dataclass
class Results:
    records: list[Record] = field(default_factory=list)
    million: Record | None = None
    snapshot: dict[str, Any] = field(default_factory=dict)
    issue2: dict[str, Any] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)
    command: str = ""
    started: float = 0.0
    duration: float = 0.0
    quick: bool = False
    chunks: int = 0
    rss_method: str = ""
    get_check: str = ""
    fingerprint_start: str = ""
    fingerprint_end: str = ""

    def get(self, variant: str, n: int) -> Record | None:
        return next((r for r in self.records if r.variant == variant and r.n == n and r.samples), None)


def repeats_for(n: int) -> int:
    return 2 if n <= 10_000 else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="N=1k and 10k only; skip the 1,000,000-item run")
    parser.add_argument("--out", type=Path, default=HERE, help="where RESULTS.md and throughput.png go")
    parser.add_argument("--keep-logs", action="store_true", help="keep the redis/worker logs directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = Results(quick=args.quick, started=time.time())
    results.command = f"cd {shlex.quote(str(Path.cwd()))} && " + " ".join(
        shlex.quote(a) for a in getattr(sys, "orig_argv", [sys.executable, "-m", "bench", *sys.argv[1:]])
    )
    t0 = time.perf_counter()
    results.fingerprint_start = fingerprint()
    workdir = Path(tempfile.mkdtemp(prefix="chordflow-bench-"))
    bench = None
    try:
        bench = bench_cluster.start(workdir)
        results.facts = bench_cluster.machine_facts(bench)
        results.chunks = variants.chunk_count(bench.processes)
        results.get_check = bench.get_check
        run_all(bench, results, args.quick)
    finally:
        if bench is not None:
            bench.stop()
        if not results.facts:
            results.facts = bench_cluster.machine_facts(None)
    results.duration = time.perf_counter() - t0
    results.fingerprint_end = fingerprint()
    if results.fingerprint_end != results.fingerprint_start:
        log("WARNING: chordflow's sources changed while the bench ran; the results mix two versions")
    results.facts["load average at end (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    md, png = report.write(results, args.out)
    log(f"wrote {md} and {png} ({results.duration:.0f} s in all)")
    if args.keep_logs:
        log(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def fingerprint() -> str:
    """sha256 over chordflow's sources (ir/, scheduler/, worker/: .py and .lua) and the newest mtime.

    Others edit the code while benchmarks run: this says which code was measured, and whether it moved.
    """
    root = HERE.parent
    digest = hashlib.sha256()
    newest = 0.0
    sources = (p for d in ("ir", "scheduler", "worker") for p in (root / d).rglob("*"))
    files = sorted(p for p in sources if p.suffix in (".py", ".lua"))
    for path in files:
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
        newest = max(newest, path.stat().st_mtime)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(newest))
    return f"sha256 {digest.hexdigest()[:16]} over {len(files)} files (newest edit {stamp})"


def run_all(bench: bench_cluster.BenchCluster, results: Results, quick: bool) -> None:
    ns = QUICK_NS if quick else FULL_NS
    naive_ns = tuple(n for n in NAIVE_NS if n in ns)
    shared = variants.item_shared({"items": []})

    def runner(variant: str, items: list[Any]) -> Callable[[], dict[str, Any]]:
        if variant == variants.NAIVE:
            return lambda: variants.run_naive(bench.client, items, shared)
        if variant == variants.CHUNKED:
            return lambda: variants.run_chunked(bench.client, items, shared, results.chunks)
        if variant == variants.CELERY:
            return lambda: variants.run_chordflow(items, "celery")
        return lambda: variants.run_chordflow(items, "local")

    log(f"warm-up: every variant once with {WARMUP_N} items (not timed)")
    for variant in variants.VARIANTS:
        runner(variant, list(range(WARMUP_N)))()
    variants.settle(bench.client)

    order = (variants.LOCAL, variants.CHUNKED, variants.CELERY, variants.NAIVE)
    for n in ns:
        items = list(range(n))
        for variant in order:
            if variant == variants.NAIVE and n not in naive_ns:
                continue
            results.records.append(timed(bench, variant, n, runner(variant, items), repeats_for(n), results))

    if not quick:
        items = list(range(MILLION))
        results.million = timed(bench, variants.CELERY, MILLION, runner(variants.CELERY, items), 1, results, 1800)
        del items

    results.snapshot = large_snapshot(bench, results)
    results.issue2 = issue2()
    for n in (10_000,) if quick else (10_000, 100_000):
        log(f"diagnostics: cProfile of one extra chordflow celery run, N={n:,} (not timed)")
        results.profiles.append(diagnose.profile_chordflow(n))


def timed(
    bench: bench_cluster.BenchCluster,
    variant: str,
    n: int,
    call: Callable[[], dict[str, Any]],
    repeats: int,
    results: Results,
    limit: int = 900,
    label: str = "",
) -> Record:
    record = Record(variant, n)
    label = label or variant
    celery = variant != variants.LOCAL
    for attempt in range(repeats):
        refreshed = inspect_cache()
        try:
            sample, info = measure(
                call,
                redis_client=bench.redis if celery else None,
                logs=bench.logs if celery else None,
                body_task=variants.BODY_TASK.get(variant, ""),
                meta_reader=bench.client.backend.get_task_meta if celery else None,
                limit=limit,
                what=f"{label} N={n}",
            )
            if variant in (variants.NAIVE, variants.CHUNKED):
                variants.settle(bench.client)  # outside the timing: this run's leftovers stay out of the next
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"
            log(f"{label:22s} N={n:>9,}  FAILED: {record.error}")
            traceback.print_exc(file=sys.stderr)
            if celery:
                bench.app.control.purge()  # leave no half-run batch in the queue for the next variant
            break
        if variant == variants.CELERY:
            sample.extra["inspect"] = inspect_cache() is not refreshed
        record.samples.append(sample)
        record.info.update(info or {})
        results.rss_method = results.rss_method or "VmHWM"
        log(
            f"{label:22s} N={n:>9,}  run {attempt + 1}/{repeats}: {sample.seconds:8.3f} s  "
            f"{sample.seconds / n * 1e6:9.2f} us/item  rss +{sample.rss_increase / 2**20:7.1f} MB"
            + (f"  redis in {sample.bytes_in / 1e6:8.2f} MB" if sample.bytes_in is not None else "")
        )
    return record


def inspect_cache() -> Any:
    """chordflow reuses the worker-process count it read from the worker registry for a few seconds;
    a run that refreshes it pays one registry read (SCAN + MGET)."""
    from worker import settings
    from worker.cluster import chunking

    return chunking._cache.get(settings.load().result_backend)


def large_snapshot(bench: bench_cluster.BenchCluster, results: Results) -> dict[str, Any]:
    """chordflow celery with a ~1 MB value in the store: bytes written to the bench's Redis."""
    items = list(range(SNAPSHOT_ITEMS))
    blob = "x" * BLOB_BYTES
    record = timed(
        bench,
        variants.CELERY,
        SNAPSHOT_ITEMS,
        lambda: variants.run_chordflow(items, "celery", blob=blob),
        2,
        results,
        label="chordflow celery +1MB",
    )
    items_bytes = len(snapshot.encode(items))
    snap_bytes = len(snapshot.encode({"items": items, "blob": blob}))
    plain = results.get(variants.CELERY, SNAPSHOT_ITEMS)
    measured = max((s.bytes_in or 0 for s in record.samples), default=None)
    out = {
        "record": record,
        "items_bytes": items_bytes,
        "snapshot_bytes": snap_bytes,
        "budget": SNAPSHOT_BUDGET + items_bytes,
        "bytes_in": measured if record.samples else None,
        "without_blob": max((s.bytes_in or 0 for s in plain.samples), default=None) if plain else None,
    }
    log(f"large snapshot: {out['bytes_in']} bytes written to Redis (budget {out['budget']})")
    return out


def issue2() -> dict[str, Any]:
    """Local sequential cost per item at 100k vs plain loops over the same NoopNode (best of 3 each).

    Judged against the loop that keeps each item's namespace (a batch returns its results); the loop
    that discards them is reported beside it.
    """
    items = list(range(ISSUE2_N))
    shared = {"items": items}
    calls = {
        "local": lambda: variants.run_chordflow(items, "local"),
        # len(): the results are freed inside the timing, as chordflow local's are (measure() would keep them)
        "plain": lambda: len(variants.plain_loop(items, shared)),
        "discarding": lambda: variants.plain_loop_discarding(items, shared),
    }
    runs = {name: [measure(call, what=f"{name} 100k")[0].seconds for _ in range(3)] for name, call in calls.items()}
    best = {name: min(seconds) for name, seconds in runs.items()}
    log(
        f"issue 2: local {best['local']:.3f} s vs plain loop {best['plain']:.3f} s (keeping results) = "
        f"{best['local'] / best['plain']:.2f}x, vs {best['discarding']:.3f} s (discarding) = "
        f"{best['local'] / best['discarding']:.2f}x"
    )
    log("issue 2: per-layer breakdown (best of 3 each)")
    return {"n": ISSUE2_N, "runs": runs, "best": best, "layers": diagnose.local_layers(ISSUE2_N)}
