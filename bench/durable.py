"""`python -m bench.durable`: what durable runs (`chordflow submit` / `wait`, and `run --backend celery`,
which is now submit + wait) cost against local runs and against the client-orchestrated path.

On its own cluster (bench/harness.py: a redis-server on a free port and two solo workers), every CLI
call in a fresh subprocess:

1. Latency: a 1-item batch through `chordflow run WF --backend celery` against `--backend local`
   (median of 5 each, interleaved); and the first N-item run on freshly started workers against the
   next (warm) one.
2. Scale: a 1,000,000-item batch with `chordflow submit` + `chordflow wait` (200,000 when that takes
   more than 5 minutes), against the same batch through `scheduler.run(wf, backend="celery")` in this
   process; the submitting client's peak RSS, the workers' peak RSS, Redis's peak memory.

Writes bench/DURABLE.md (or --out). Progress lines go to stderr.

Internal modules it uses beyond the public API: `worker.cluster.state.runs`.
"""

from __future__ import annotations

import json
import shlex
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from bench import harness
from bench.harness import POOL, BenchCluster, Child, Phase, Session, log, mb, redis_text, verdict, worker_text
from bench.measure import PeakRss, deadline

SCALE_LIMIT = 300  # seconds: above this the scale run falls back to FALLBACK items
LATENCY_BUDGET = 0.4  # seconds: celery may take this much longer than local for a 1-item run
FIRST_RATIO = 2.0  # the first N-item run on fresh workers within 2x the warm one
SUBMIT_RSS_MB = 100


@dataclass(frozen=True)
class Sizes:
    repeats: int  # 1-item runs per backend
    warm_n: int  # the first-vs-warm run
    scale_n: int
    fallback_n: int


FULL = Sizes(repeats=5, warm_n=20_000, scale_n=1_000_000, fallback_n=200_000)
QUICK = Sizes(repeats=3, warm_n=2_000, scale_n=20_000, fallback_n=10_000)


def main(argv: list[str] | None = None) -> int:
    args = harness.arguments("bench.durable", __doc__, "DURABLE.md", f"small sizes: {QUICK}", argv)
    harness.run_bench(args, measure, report)
    return 0


def workflow() -> dict[str, Any]:
    """One echo batch node over the input `items` (every item costs about what a no-op node does)."""
    return {
        "ir_version": "0.1.0",
        "name": "durable_bench",
        "inputs": {"items": {"description": "the batch's items", "required": True}},
        "nodes": [{"id": "b", "type": "echo", "batch": {"items": "${items}"}, "params": {"v": "${item}"}}],
    }


def check_run(child: Child, n: int) -> None:
    """`chordflow run`/`wait` text output: the run succeeded and its batch has all n items."""
    expected = f"b: {n} items, {n} succeeded, 0 failed"
    if child.code != 0 or "status: success" not in child.stdout or expected not in child.stdout:
        raise child.failure()


@dataclass
class Results:
    sizes: Sizes
    celery_1: list[Child] = field(default_factory=list)
    local_1: list[Child] = field(default_factory=list)
    warm_runs: list[Child] = field(default_factory=list)
    scale: dict[str, Any] = field(default_factory=dict)


def measure(session: Session, bench: BenchCluster) -> Results:
    runs = Runs(bench, Results(QUICK if session.quick else FULL))
    runs.first_and_warm()  # first: the workers must not have run anything yet
    runs.latency()
    runs.scale()
    return runs.results


class Runs:
    """The CLI runs of one workflow file (written before any timing) on the bench's cluster."""

    def __init__(self, bench: BenchCluster, results: Results):
        self.bench, self.results, self.sizes = bench, results, results.sizes
        self.wf = str(bench.write("wf.json", json.dumps(workflow())))

    def inputs(self, n: int) -> str:
        return str(self.bench.write(f"inputs-{n}.json", json.dumps({"items": list(range(n))})))

    def run_cli(self, n: int, backend: str) -> Child:
        child = self.bench.cli("run", self.wf, "--inputs-file", self.inputs(n), "--backend", backend)
        check_run(child, n)
        return child

    def first_and_warm(self) -> None:
        """The first N-item run on freshly started workers, then two more (warm), each from a fresh CLI."""
        n = self.sizes.warm_n
        self.inputs(n)
        for attempt in range(3):
            child = self.run_cli(n, "celery")
            self.results.warm_runs.append(child)
            log(f"run --backend celery N={n:,} #{attempt + 1}: {child.seconds:.3f} s (client rss {mb(child.maxrss)})")

    def latency(self) -> None:
        """1-item runs from fresh processes, celery and local interleaved (the order swapped every round)."""
        for backend in ("celery", "local"):  # untimed: one of each first (page cache, the embedded store file)
            self.run_cli(1, backend)
        for attempt in range(self.sizes.repeats):
            for backend in ("celery", "local") if attempt % 2 == 0 else ("local", "celery"):
                child = self.run_cli(1, backend)
                (self.results.celery_1 if backend == "celery" else self.results.local_1).append(child)
                log(f"run --backend {backend} N=1 #{attempt + 1}: {child.seconds:.3f} s")

    def scale(self) -> None:
        sizes, scale = self.sizes, self.results.scale
        submit = self.bench.cli("submit", self.wf, "--inputs-file", self.inputs(1))  # the client's RSS floor
        check_run(self.bench.cli("wait", submit.last_line()), 1)
        scale["submit_floor"] = submit
        log(f"submit N=1: {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")
        durable = self.durable(sizes.scale_n)
        if durable is None:
            scale["fell_back_from"] = sizes.scale_n
            durable = self.durable(sizes.fallback_n)
            if durable is None:
                raise RuntimeError(f"{sizes.fallback_n:,} items took over {SCALE_LIMIT} s as well")
        scale["durable"] = durable
        scale["client"] = self.client(durable["n"])
        scale["resettable"] = self.bench.peaks.resettable

    def durable(self, n: int) -> dict[str, Any] | None:
        """`chordflow submit` + `chordflow wait` of an n-item batch; None when it took over SCALE_LIMIT."""
        from worker.cluster.state.runs import ClusterRuns

        bench, path = self.bench, self.inputs(n)
        with Phase(bench) as phase:
            submit = bench.cli("submit", self.wf, "--inputs-file", path)
            run_id = submit.last_line()
            log(f"submit N={n:,}: run {run_id} in {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")
            remaining = max(1.0, SCALE_LIMIT - phase.elapsed())
            waited = bench.cli("wait", run_id, "--timeout", f"{remaining:.0f}", limit=remaining + 120)
        if waited.code == 124:
            log(f"wait N={n:,}: not done after {SCALE_LIMIT} s; cancelling run {run_id}")
            bench.cli("cancel", run_id)
            bench.purge()
            time.sleep(2)
            bench.forget(run_id)
            return None
        check_run(waited, n)
        log(f"submit + wait N={n:,}: {phase.seconds:.3f} s; wait's peak rss {mb(waited.maxrss)}")
        rows_path = bench.workdir / "rows.jsonl"
        streamed = bench.cli("results", run_id, "--node", "b", "--out", str(rows_path))
        if streamed.code != 0:
            raise streamed.failure()
        with rows_path.open("rb") as rows:
            lines = sum(1 for _ in rows)
        if lines != n:
            raise RuntimeError(f"chordflow results --node b wrote {lines} lines, expected {n}")
        log(f"results --node b N={n:,}: {streamed.seconds:.3f} s, peak rss {mb(streamed.maxrss)}")
        record = ClusterRuns().get(run_id)
        timeline = bench.logs.tasks()
        bench.forget(run_id)
        return {
            **phase.as_dict(),
            "n": n,
            "timeline": timeline,
            "record": (record.created - phase.wall, record.updated - phase.wall) if record else None,
            "submit": submit,
            "wait": waited,
            "results": streamed,
            "results_bytes": rows_path.stat().st_size,
        }

    def client(self, n: int) -> dict[str, Any]:
        """The same batch through `scheduler.run(wf, backend="celery")` in this process (the client drives)."""
        import scheduler

        items = list(range(n))
        with Phase(self.bench) as phase, PeakRss() as rss, deadline(1800, f"scheduler.run N={n}"):
            result = scheduler.run(workflow(), {"items": items}, backend="celery")
            seconds = phase.elapsed()
            ok = result.status == "success" and result.shared["b"]["success_count"] == n
            run_id = result.run_id
            del result
        if not ok:
            raise RuntimeError(f"scheduler.run N={n} did not succeed with {n} items")
        log(f"scheduler.run(backend='celery') N={n:,}: {seconds:.3f} s; rss +{mb(rss.increase)}")
        timeline = self.bench.logs.tasks()
        self.bench.forget(run_id)
        return {
            **phase.as_dict(),
            "n": n,
            "seconds": seconds,
            "timeline": timeline,
            "rss_increase": rss.increase,
            "rss_method": rss.method,
        }


# -- the report ------------------------------------------------------------------------------------------------
def spread(children: list[Child]) -> str:
    return ", ".join(f"{c.seconds:.2f}" for c in children)


def rows(results: Results) -> list[tuple[str, str, str, str]]:
    """(measurement, result, target, verdict) rows."""
    out: list[tuple[str, str, str, str]] = []

    def row(label: str, value: str, target: str = "", ok: bool | None = None) -> None:
        out.append((label, value, target, "" if ok is None else verdict(ok)))

    if results.celery_1 and results.local_1:
        celery = statistics.median(c.seconds for c in results.celery_1)
        local = statistics.median(c.seconds for c in results.local_1)
        row(
            f"1-item batch, `chordflow run --backend local`, fresh process (median of {len(results.local_1)})",
            f"{local:.3f} s ({spread(results.local_1)})",
        )
        row(
            f"the same, `--backend celery` (median of {len(results.celery_1)})",
            f"{celery:.3f} s ({spread(results.celery_1)})",
        )
        row("celery - local", f"{celery - local:+.3f} s", f"<= {LATENCY_BUDGET} s", celery - local <= LATENCY_BUDGET)
    if len(results.warm_runs) >= 2:
        first, warm = results.warm_runs[0], results.warm_runs[1]
        later = ", ".join(f"{c.seconds:.2f} s" for c in results.warm_runs[2:])
        row(
            f"first {results.sizes.warm_n:,}-item run on fresh workers (`run --backend celery`, fresh process)",
            f"{first.seconds:.3f} s",
        )
        row("the second (warm) one, fresh process", f"{warm.seconds:.3f} s" + (f" (third: {later})" if later else ""))
        ratio_ok = first.seconds <= FIRST_RATIO * warm.seconds
        row("first / warm", f"{first.seconds / warm.seconds:.2f}x", f"<= {FIRST_RATIO:g}x", ratio_ok)
    durable, client = results.scale.get("durable"), results.scale.get("client")
    if not (durable and client):
        return out
    n, submit, waited = durable["n"], durable["submit"], durable["wait"]
    row(
        f"{n:,}-item batch: `chordflow submit` + `chordflow wait` (submit start to wait end)",
        f"{durable['seconds']:.3f} s ({durable['seconds'] / n * 1e6:.1f} us/item)",
    )
    row("of which `chordflow submit` (returns the run id)", f"{submit.seconds:.3f} s ({submit.cpu:.2f} s CPU)")
    row("of which `chordflow wait` (to the summary)", f"{waited.seconds:.3f} s ({waited.cpu:.2f} s CPU)")
    row(
        'the same in-process, `scheduler.run(wf, backend="celery")` (client-orchestrated)',
        f"{client['seconds']:.3f} s ({client['seconds'] / n * 1e6:.1f} us/item)",
    )
    row("durable / client-orchestrated", f"{durable['seconds'] / client['seconds']:.2f}x")
    row("where the durable run's time goes (seconds from submit start)", timeline_text(durable))
    row("where the client-orchestrated run's time goes (seconds from its start)", timeline_text(client))
    row(
        "peak RSS of the `chordflow submit` process (whole process, GNU time %M)",
        mb(submit.maxrss),
        f"< {SUBMIT_RSS_MB} MB",
        submit.maxrss < SUBMIT_RSS_MB * 2**20,
    )
    row("the same for a 1-item input (interpreter and imports)", mb(results.scale["submit_floor"].maxrss))
    row("peak RSS of the `chordflow wait` process", mb(waited.maxrss))
    row(
        f"`chordflow results RUN --node b --out FILE`: all {n:,} rows streamed to a file",
        f"{durable['results'].seconds:.3f} s ({mb(durable['results_bytes'])} written), "
        f"peak RSS {mb(durable['results'].maxrss)}",
    )
    row(
        "peak RSS increase of the `scheduler.run` process (this bench)",
        f"+{mb(client['rss_increase'])} ({client['rss_method']})",
    )
    row("worker peak RSS (VmHWM), durable run", worker_text(durable["workers"]))
    row("worker peak RSS (VmHWM), client-orchestrated run", worker_text(client["workers"]))
    row("Redis peak memory, durable run", redis_text(durable))
    row("Redis peak memory, client-orchestrated run", redis_text(client))
    return out


def notes(results: Results) -> list[str]:
    out, durable, floor = [], results.scale.get("durable"), results.scale.get("submit_floor")
    fell = results.scale.get("fell_back_from")
    if fell:
        out.append(
            f"- **The {fell:,}-item durable run did not finish within {SCALE_LIMIT} s on this machine**; it was "
            f"cancelled and the scale rows measure {durable['n'] if durable else '?':,} items instead."
        )
    if durable and floor is not None and durable["submit"].maxrss >= SUBMIT_RSS_MB * 2**20:
        extra = durable["submit"].maxrss - floor.maxrss
        out.append(
            f"- The submitting client misses {SUBMIT_RSS_MB} MB because the items are an input: the same "
            f"`chordflow submit` with a 1-item input peaks at {mb(floor.maxrss)} (interpreter and imports), "
            f"and the {durable['n']:,} items add {mb(extra)}: the JSON file's text, the decoded list, the "
            "input check and the encoded store that goes to Redis are all in memory at once."
        )
    if results.scale and not results.scale.get("resettable", True):
        out.append("- Worker VmHWM could not be reset between phases: the worker rows are lifetime peaks.")
    return out


def report(session: Session, results: Results) -> str:
    sizes = results.sizes
    body = f"""{harness.table(("measurement", "result", "target", ""), rows(results))}

{chr(10).join(notes(results))}

## Method

- One `scheduler.localcluster.Cluster`: its own `redis-server` on a free port and two solo workers
  (`celery -A worker.app worker -P {POOL} -c 1`, as `python -m bench`), started by this bench and stopped
  in a `finally`. The workflow is one `echo` batch node, params `{{"v": "${{item}}"}}`, over the input
  `items` = `[0, 1, ..., N-1]`, passed with `--inputs-file` (JSON written before the timing).
- Every `chordflow` command is a fresh subprocess (`{shlex.join(harness.chordflow())}`); wall time is measured
  around the whole process (interpreter start, imports, run, exit). Its peak RSS is GNU time's `%M` for it (wait4's
  `ru_maxrss` would include the bench process's RSS at the fork). Each run's text output is checked:
  `status: success` and N items succeeded.
- Latency: one untimed run of each backend first, then {sizes.repeats} of each, interleaved, the order
  swapped every round. Local runs write their embedded store in a temp `CHORDFLOW_HOME`.
- First vs warm: the first three runs on the cluster, right after the workers printed `ready.`; the
  first one pays the workers' first-chunk costs (imports, connections, the worker-count lookup).
- Scale: `chordflow submit` then `chordflow wait RUN_ID --timeout` (the remainder of {SCALE_LIMIT} s),
  timed from submit start to wait end; submit streams the inputs file into the run's stored bytes
  (scheduler/inputs_file.py), and
  `wait` loads the final store (N results) to print its summary. The client-orchestrated run is
  `scheduler.run(wf, {{"items": items}}, backend="celery")` in the bench process, with the item list
  built before the timing; its RSS is `PeakRss` (VmHWM after a reset). Worker RSS is VmHWM of both worker
  processes and any pool children, reset via `/proc/<pid>/clear_refs` before each run. Redis memory:
  `INFO memory`. used_memory_peak cannot be reset on Redis 7.0 without a restart: when a run raised it,
  it is that run's exact peak; otherwise the row gives the maximum of used_memory sampled every 10 ms.
  Each run's `cf:{{run}}:*` keys are deleted before the next run.
- "Where the time goes": the workers' own log lines (task received / succeeded in, ms timestamps on the
  same clock) and the run record's last update, relative to the start; worker task time is summed over
  both workers. CPU of the CLI processes is their rusage (user + system)."""
    return harness.document(session, "Durable runs: latency and scale", body)


def timeline_text(phase: dict[str, Any]) -> str:
    """Submit, the run record, the workers' first and last task, the end; and the workers' task time."""
    wall, timeline = phase["wall"], phase["timeline"]
    parts = []
    if "submit" in phase:
        parts.append(f"submit exits {phase['submit'].seconds:.2f}")
    if timeline["first_received"] is not None:
        parts.append(f"first task received {timeline['first_received'] - wall:.2f}")
    if timeline["last_done"] is not None:
        parts.append(f"last task done {timeline['last_done'] - wall:.2f}")
    if phase.get("record"):
        parts.append(f"run record final {phase['record'][1]:.2f}")
    parts.append(f"{'wait' if 'submit' in phase else 'scheduler.run'} returns {phase['seconds']:.2f}")
    tasks = "; ".join(
        f"{name.removeprefix('chordflow.')} {count} x, {secs:.2f} s"
        for name, (count, secs) in sorted(timeline["tasks"].items())
    )
    return ", ".join(parts) + (f". Worker task time: {tasks}" if tasks else "")


if __name__ == "__main__":
    raise SystemExit(main())
