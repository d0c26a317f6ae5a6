"""`python -m bench`: every variant measured in one run, on one bench-owned redis-server and two workers.

Writes RESULTS.md and throughput.png into --out (default: this directory). Progress goes to stderr.

Internal modules it uses beyond the public API: `ir.snapshot`, `worker.cluster.app`,
`worker.cluster.batches.chunking`, `worker.cluster.signing`, `worker.settings`.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import diagnose, harness, raw_tasks, report, variants
from bench.harness import BenchCluster, log
from bench.measure import Sample, time_call
from ir import snapshot

TASKS = (*raw_tasks.TASK_NAMES, "chordflow.run_chunk", "chordflow.aggregate")  # every worker must have them
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
    per_item: dict[str, Any] = field(default_factory=dict)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    get_check: str = ""

    def get(self, variant: str, n: int) -> Record | None:
        return next((r for r in self.records if r.variant == variant and r.n == n and r.samples), None)


def repeats_for(n: int) -> int:
    return 2 if n <= 10_000 else 1


def main(argv: list[str] | None = None) -> int:
    args = harness.arguments("bench", __doc__, "RESULTS.md", "N=1k and 10k only; skip the 1,000,000-item run", argv)
    harness.run_bench(args, measure, report.render, plugins=raw_tasks.__name__, needed=TASKS)
    return 0


def measure(session: harness.Session, bench: BenchCluster) -> Results:
    """Every variant on the bench's cluster; the raw baselines through a stock client signing as chordflow."""
    from worker.cluster import signing
    from worker.cluster.app import current_app

    app = current_app()
    stock = signing.sign_messages(variants.stock_client(), app.signer)  # the workers drop unsigned tasks
    results = Results(chunks=variants.chunk_count(bench.processes), get_check=check_get(app))
    log(f"AsyncResult.get() on chordflow's own app: {results.get_check}")
    conf = app.conf
    session.facts["celery app"] = (
        f"worker/app.py: serializer {conf.task_serializer}/{conf.result_serializer}, "
        f"acks_late={conf.task_acks_late}, prefetch_multiplier={conf.worker_prefetch_multiplier}, "
        f"result_chord_ordered={conf.result_chord_ordered}, task events on, "
        "every task message signed and verified (HMAC-SHA256, worker/cluster/signing.py)"
    )
    try:
        Runs(bench, stock, results).all(session.quick)
    finally:  # results unsubscribe when released: let them, while Redis is still up
        variants.settle(stock)
        gc.collect()
        with contextlib.suppress(Exception):  # no result consumer was ever started, or it is closed
            stock.backend.result_consumer.stop()
    return results


def check_get(app: Any, delay: float = 0.5, timeout: float = 3.0) -> str:
    """Does `AsyncResult.get()` work on chordflow's app, for a task that is not one of chordflow's chords?

    It did not when this bench was written: RunResultBackend skipped every result subscription, so such
    a `.get()` waited until its timeout. Found here and fixed (subscriptions are skipped only inside
    `backend.quiet()`; tests/worker/cluster/test_distributed.py::
    test_other_tasks_on_the_app_can_still_wait_for_their_results).
    This stays as a regression check. The task is sent with a countdown so that it cannot be finished when
    `.get()` starts: a `.get()` that looks at the stored state once and never hears of it later times out.
    """
    from celery.exceptions import TimeoutError as CeleryTimeout

    result = app.signature(raw_tasks.NAIVE_TASK, args=({}, 0)).apply_async(countdown=delay)
    t0 = time.perf_counter()
    backend = f"{type(app.backend).__module__}.{type(app.backend).__name__}"
    try:
        result.get(timeout=timeout)
    except CeleryTimeout:
        stored = result.backend.get_task_meta(result.id).get("status")
        return (
            f"a task sent with countdown={delay} s was not seen by `.get(timeout={timeout:.0f})`: timed out although "
            f"the worker had stored the result (state {stored}); result backend {backend}"
        )
    return f"returned after {time.perf_counter() - t0:.3f} s for a task sent with countdown={delay} s ({backend})"


class Runs:
    """The timed runs on one cluster: `bench` for chordflow, `stock` (a stock Celery client) for the baselines."""

    def __init__(self, bench: BenchCluster, stock: Any, results: Results):
        self.bench, self.stock, self.results = bench, stock, results

    def call(self, variant: str, items: list[Any], **extra: Any) -> Callable[[], None]:
        shared = variants.item_shared({"items": []})
        if variant == variants.NAIVE:
            return lambda: variants.run_naive(self.stock, items, shared)
        if variant == variants.CHUNKED:
            return lambda: variants.run_chunked(self.stock, items, shared, self.results.chunks)
        backend = "celery" if variant == variants.CELERY else "local"
        return lambda: variants.run_chordflow(items, backend, **extra)

    def all(self, quick: bool) -> None:
        results = self.results
        log(f"warm-up: every variant once with {WARMUP_N} items (not timed)")
        for variant in variants.VARIANTS:
            self.call(variant, list(range(WARMUP_N)))()
        variants.settle(self.stock)
        ns = QUICK_NS if quick else FULL_NS
        for n in ns:
            items = list(range(n))
            for variant in (variants.LOCAL, variants.CHUNKED, variants.CELERY, variants.NAIVE):
                if variant != variants.NAIVE or n in NAIVE_NS:
                    results.records.append(self.timed(variant, items, repeats_for(n)))
        if not quick:
            results.million = self.timed(variants.CELERY, list(range(MILLION)), 1, limit=1800)
        results.snapshot = self.large_snapshot()
        results.per_item = per_item()
        for n in (10_000,) if quick else (10_000, 100_000):
            log(f"diagnostics: cProfile of one extra chordflow celery run, N={n:,} (not timed)")
            results.profiles.append(diagnose.profile_chordflow(n))

    def timed(self, variant: str, items: list[Any], repeats: int, limit: int = 900, **extra: Any) -> Record:
        """`repeats` timed runs of one variant; the first failure ends them (recorded, the bench goes on)."""
        n, bench = len(items), self.bench
        record = Record(variant, n)
        label = variant + (" +1MB" if extra else "")
        call = self.call(variant, items, **extra)
        celery = variant != variants.LOCAL
        for attempt in range(repeats):
            refreshed = inspect_cache()
            try:
                sample = time_call(
                    call,
                    redis_client=bench.redis if celery else None,
                    logs=bench.logs if celery else None,
                    body_task=variants.BODY_TASK.get(variant, ""),
                    meta_reader=self.stock.backend.get_task_meta if celery else None,
                    limit=limit,
                    what=f"{label} N={n}",
                )
                if variant in (variants.NAIVE, variants.CHUNKED):
                    variants.settle(self.stock)  # outside the timing: this run's leftovers stay out of the next
            except Exception as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                log(f"{label:22s} N={n:>9,}  FAILED: {record.error}")
                traceback.print_exc(file=sys.stderr)
                if celery:
                    bench.purge()  # leave no half-run batch in the queue for the next variant
                break
            if variant == variants.CELERY:
                sample.extra["inspect"] = inspect_cache() is not refreshed
            record.samples.append(sample)
            log(
                f"{label:22s} N={n:>9,}  run {attempt + 1}/{repeats}: {sample.seconds:8.3f} s  "
                f"{sample.seconds / n * 1e6:9.2f} us/item  rss +{sample.rss_increase / 2**20:7.1f} MB"
                + (f"  redis in {sample.bytes_in / 1e6:8.2f} MB" if sample.bytes_in is not None else "")
            )
        return record

    def large_snapshot(self) -> dict[str, Any]:
        """chordflow celery with a ~1 MB value in the store: bytes written to the bench's Redis."""
        items = list(range(SNAPSHOT_ITEMS))
        blob = "x" * BLOB_BYTES
        record = self.timed(variants.CELERY, items, 2, blob=blob)
        items_bytes = len(snapshot.encode(items))
        plain = self.results.get(variants.CELERY, SNAPSHOT_ITEMS)
        out = {
            "record": record,
            "items_bytes": items_bytes,
            "snapshot_bytes": len(snapshot.encode({"items": items, "blob": blob})),
            "budget": SNAPSHOT_BUDGET + items_bytes,
            "bytes_in": max((s.bytes_in or 0 for s in record.samples), default=None) if record.samples else None,
            "without_blob": max((s.bytes_in or 0 for s in plain.samples), default=None) if plain else None,
        }
        log(f"large snapshot: {out['bytes_in']} bytes written to Redis (budget {out['budget']})")
        return out


def inspect_cache() -> Any:
    """chordflow reuses the worker-process count it read from the worker registry for a few seconds;
    a run that refreshes it pays one registry read (SCAN + MGET)."""
    from worker import settings
    from worker.cluster.batches import chunking

    return chunking.last_read(settings.load().result_backend)


def per_item() -> dict[str, Any]:
    """Local sequential cost per item at 100k vs plain loops over the same NoopNode (best of 3 each).

    Judged against the loop that keeps each item's namespace (a batch returns its results); the loop
    that discards them is reported beside it.
    """
    items = list(range(ISSUE2_N))
    shared = {"items": items}
    calls = {
        "local": lambda: variants.run_chordflow(items, "local"),
        # len(): the results are freed inside the timing, as chordflow local's are
        "plain": lambda: len(variants.plain_loop(items, shared)),
        "discarding": lambda: variants.plain_loop_discarding(items, shared),
    }
    runs = {name: [time_call(call, what=f"{name} 100k").seconds for _ in range(3)] for name, call in calls.items()}
    best = {name: min(seconds) for name, seconds in runs.items()}
    log(
        f"local per-item cost: local {best['local']:.3f} s vs plain loop {best['plain']:.3f} s (keeping results) = "
        f"{best['local'] / best['plain']:.2f}x, vs {best['discarding']:.3f} s (discarding) = "
        f"{best['local'] / best['discarding']:.2f}x"
    )
    log("local per-item cost: per-layer breakdown (best of 3 each)")
    return {"n": ISSUE2_N, "runs": runs, "best": best, "layers": diagnose.local_layers(ISSUE2_N)}
