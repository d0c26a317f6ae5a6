"""`python -m bench.durable`: what durable runs (`chordflow submit` / `wait`, and `run --backend celery`,
which is now submit + wait) cost against local runs and against the client-orchestrated path.

Starts its own cluster (scheduler.localcluster.Cluster: a redis-server on a free port and two solo
workers, as bench/run.py) and measures, every CLI call in a fresh subprocess:

1. Latency: a 1-item batch through `chordflow run WF --backend celery` against `--backend local`
   (median of 5 each, interleaved); and the first N-item run on freshly started workers against the
   next (warm) one.
2. Scale: a 1,000,000-item batch with `chordflow submit` + `chordflow wait` (200,000 when that takes
   more than 5 minutes), against the same batch through `scheduler.run(wf, backend="celery")` in this
   process; the submitting client's peak RSS, the workers' peak RSS, Redis's peak memory.

Writes bench/DURABLE.md (or --out). Progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import PeakRss, deadline, log
from scheduler.localcluster import Cluster

HERE = Path(__file__).resolve().parent
WORKERS = ("w1", "w2")  # two solo workers = 2 worker processes, as bench/run.py
POOL = "solo"
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


def workflow() -> dict[str, Any]:
    """One echo batch node over the input `items` (every item costs about what a no-op node does)."""
    return {
        "ir_version": "0.1.0",
        "name": "durable_bench",
        "inputs": {"items": {"description": "the batch's items", "required": True}},
        "nodes": [{"id": "b", "type": "echo", "batch": {"items": "${items}"}, "params": {"v": "${item}"}}],
    }


# -- child processes -------------------------------------------------------------------------------------


@dataclass
class Child:
    argv: list[str]
    seconds: float
    maxrss: int  # bytes: the child's own peak RSS (wait4's rusage, exactly that child)
    code: int
    stdout: str
    stderr: str
    cpu: float = 0.0  # seconds of CPU (user + system) the child used


def chordflow() -> list[str]:
    script = Path(sys.executable).with_name("chordflow")
    return [str(script)] if script.exists() else [sys.executable, "-m", "scheduler.cli"]


#: Linux carries a process's peak RSS across exec: a child forked from this (large) bench process reports at
#: least the bench's own RSS from wait4. GNU time, small itself, forks the measured command and reports its
#: true peak (`%M`, KB) on the last line of stderr.
TIME = shutil.which("time") or "/usr/bin/time"
MAXRSS_MARK = "chordflow-bench-maxrss-kb="


def run_child(argv: list[str], env: dict[str, str], workdir: Path, limit: float = 1800) -> Child:
    """Run argv to its end: wall time, its exit code and output, and its own peak RSS (through GNU time when
    present, else wait4's, which may include this process's RSS at the fork). The child runs in its own
    session: past `limit` the whole group is killed (GNU time and the command it measures), exit code -9."""
    measured = Path(TIME).exists()
    full = [TIME, "-f", f"{MAXRSS_MARK}%M", *argv] if measured else argv
    with tempfile.TemporaryFile("w+", dir=workdir) as out, tempfile.TemporaryFile("w+", dir=workdir) as err:
        started = time.perf_counter()
        proc = subprocess.Popen(full, stdout=out, stderr=err, env=env, text=True, start_new_session=True)

        def kill_group() -> None:
            with contextlib.suppress(ProcessLookupError):  # it ended as the timer fired
                os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(limit, kill_group)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        cpu = usage.ru_utime + usage.ru_stime
        stderr, maxrss = err.read(), usage.ru_maxrss * 1024
        if measured and MAXRSS_MARK in stderr:
            stderr, _, kb = stderr.rpartition(MAXRSS_MARK)
            maxrss = int(kb.strip()) * 1024
        return Child(argv, seconds, maxrss, proc.returncode, out.read(), stderr, cpu)


def check_run(child: Child, n: int) -> None:
    """`chordflow run`/`wait` text output: the run succeeded and its batch has all n items."""
    expected = f"b: {n} items, {n} succeeded, 0 failed"
    if child.code != 0 or "status: success" not in child.stdout or expected not in child.stdout:
        raise RuntimeError(
            f"{shlex.join(child.argv)} exited {child.code}:\n{child.stdout[-2000:]}\n{child.stderr[-2000:]}"
        )


# -- the cluster's processes: worker peak RSS, Redis memory ------------------------------------------------


def _tree(pid: int) -> list[int]:
    """pid and its descendants (a prefork worker's pool children; none for solo)."""
    pids = [pid]
    for tid in _listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
                pids += _tree(int(child))
    return pids


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _status_kb(pid: int, name: str) -> int:
    with contextlib.suppress(OSError):
        match = re.search(rf"^{name}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
        if match:
            return int(match.group(1)) * 1024
    return 0


class WorkerPeaks:
    """Peak RSS (VmHWM) of every worker process, reset before a phase via /proc/<pid>/clear_refs."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.resettable = True

    def pids(self) -> list[int]:
        return [pid for worker in self.cluster.workers.values() for pid in _tree(worker.pid)]

    def reset(self) -> None:
        for pid in self.pids():
            try:
                Path(f"/proc/{pid}/clear_refs").write_text("5")
            except OSError:
                self.resettable = False

    def read(self) -> dict[int, int]:
        return {pid: _status_kb(pid, "VmHWM") for pid in self.pids()}


class RedisPeak:
    """Redis's used_memory sampled every 10 ms over a block, beside its lifetime used_memory_peak
    (CONFIG RESETSTAT does not reset the peak on Redis 7.0)."""

    def __init__(self, client: Any):
        self.client = client
        self.before = 0
        self.sampled = 0
        self.lifetime = 0
        self.lifetime_before = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RedisPeak:
        memory = self.client.info("memory")
        self.before = int(memory["used_memory"])
        self.lifetime_before = int(memory["used_memory_peak"])
        self.sampled = self.before
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(Exception):
                self.sampled = max(self.sampled, int(self.client.info("memory")["used_memory"]))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        memory = self.client.info("memory")
        self.sampled = max(self.sampled, int(memory["used_memory"]))
        self.lifetime = int(memory["used_memory_peak"])

    def as_dict(self) -> dict[str, int]:
        return {
            "redis_before": self.before,
            "redis_sampled": self.sampled,
            "redis_lifetime": self.lifetime,
            "redis_lifetime_before": self.lifetime_before,
        }


_TASK_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[\w-]+\] Task (?P<name>[\w.]+)\[[\w-]+\] "
    r"(?:received|succeeded in (?P<secs>[\d.e-]+)s)"
)


class TaskLog:
    """What the workers logged since `mark()`: per task name, how many succeeded and their summed run time;
    and when the first task was received and the last one finished (log timestamps, wall clock)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.offsets = dict.fromkeys(paths, 0)

    def mark(self) -> None:
        self.offsets = {p: p.stat().st_size if p.exists() else 0 for p in self.paths}

    def read(self, settle: float = 0.5) -> dict[str, Any]:
        time.sleep(settle)  # the last task's "succeeded" line is written after its result
        tasks: dict[str, list[float]] = {}
        first = last = None
        for path in self.paths:
            with path.open("rb") as f:
                f.seek(self.offsets[path])
                for raw in f:
                    m = _TASK_LINE.match(raw.decode("utf-8", "replace"))
                    if not m:
                        continue
                    at = datetime.datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                    if m.group("secs") is None:
                        first = at if first is None else min(first, at)
                    else:
                        entry = tasks.setdefault(m.group("name"), [0, 0.0])
                        entry[0] += 1
                        entry[1] += float(m.group("secs"))
                        last = at if last is None else max(last, at)
        return {"tasks": tasks, "first_received": first, "last_done": last}


def forget_run(client: Any, run_id: str) -> int:
    """Delete one run's keys from the bench's Redis (so the next phase's memory starts clean)."""
    keys = list(client.scan_iter(match=f"cf:{{{run_id}}}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])
    return len(keys)


# -- the measurements ------------------------------------------------------------------------------------


@dataclass
class Results:
    sizes: Sizes
    quick: bool
    command: str = ""
    started: float = 0.0
    duration: float = 0.0
    facts: dict[str, str] = field(default_factory=dict)
    celery_1: list[Child] = field(default_factory=list)
    local_1: list[Child] = field(default_factory=list)
    warm_runs: list[Child] = field(default_factory=list)
    scale: dict[str, Any] = field(default_factory=dict)
    fingerprint_start: str = ""
    fingerprint_end: str = ""


class Bench:
    """A bench cluster (its own redis-server, two solo workers), a workflow file and the CLI children's env.

    `plugins`: what the workers import (default: CHORDFLOW_PLUGINS); `doc`: the workflow (default `workflow()`);
    `env`: on top of the cluster's, for the CLI children."""

    def __init__(
        self, workdir: Path, plugins: str | None = None, doc: dict[str, Any] | None = None, env: dict | None = None
    ):
        self.workdir = workdir
        self.cluster = Cluster(workdir, plugins=os.environ.get("CHORDFLOW_PLUGINS", "") if plugins is None else plugins)
        home = workdir / "home"  # the embedded store of local runs (and of scheduler.run), not ~/.chordflow
        home.mkdir()
        os.environ["CHORDFLOW_HOME"] = str(home)
        self.env = {**self.cluster.env, "CHORDFLOW_HOME": str(home), "COLUMNS": "200", **(env or {})}
        self.previous: dict[str, str | None] = {}
        self.redis: Any = None
        self.tasks = TaskLog([])
        self.peaks = WorkerPeaks(self.cluster)
        self.wf_path = workdir / "wf.json"
        self.wf_path.write_text(json.dumps(doc or workflow()))

    def start(self) -> None:
        import redis

        log(f"redis-server on {self.cluster.redis.url} (pid {self.cluster.redis.pid}); logs in {self.workdir}")
        for name in WORKERS:
            worker = self.cluster.start_worker(name, pool=POOL, concurrency=1)
            log(f"worker {name}: -P {POOL} -c 1 (pid {worker.pid}) ready")
        self.previous = self.cluster.apply_env()
        self.redis = redis.Redis.from_url(self.cluster.redis.url)
        self.tasks = TaskLog([worker.log for worker in self.cluster.workers.values()])

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            from worker.cluster.app import current_app

            current_app().backend.result_consumer.stop()
        self.cluster.stop()
        self.cluster.restore_env(self.previous)
        log("cluster stopped (redis-server and both workers)")

    def inputs(self, n: int) -> Path:
        path = self.workdir / f"inputs-{n}.json"
        if not path.exists():
            path.write_text(json.dumps({"items": list(range(n))}))
        return path

    def cli(self, *args: str, limit: float = 1800) -> Child:
        return run_child([*chordflow(), *args], self.env, self.workdir, limit)

    def run_cli(self, n: int, backend: str) -> Child:
        child = self.cli("run", str(self.wf_path), "--inputs-file", str(self.inputs(n)), "--backend", backend)
        check_run(child, n)
        return child


def first_and_warm(bench: Bench, results: Results) -> None:
    """The first N-item run on freshly started workers, then two more (warm), each from a fresh CLI."""
    n = results.sizes.warm_n
    bench.inputs(n)
    for attempt in range(3):
        child = bench.run_cli(n, "celery")
        results.warm_runs.append(child)
        log(f"run --backend celery N={n:,} #{attempt + 1}: {child.seconds:.3f} s (client rss {mb(child.maxrss)})")


def latency(bench: Bench, results: Results) -> None:
    """1-item runs from fresh processes, celery and local interleaved (the order swapped every round)."""
    bench.inputs(1)
    for backend in ("celery", "local"):  # untimed: one of each first (page cache, the embedded store file)
        bench.run_cli(1, backend)
    for attempt in range(results.sizes.repeats):
        order = ("celery", "local") if attempt % 2 == 0 else ("local", "celery")
        for backend in order:
            child = bench.run_cli(1, backend)
            (results.celery_1 if backend == "celery" else results.local_1).append(child)
            log(f"run --backend {backend} N=1 #{attempt + 1}: {child.seconds:.3f} s")


def submit_floor(bench: Bench, results: Results) -> None:
    """`chordflow submit` of a 1-item input, then its `wait`: the submitting process's RSS floor."""
    submit = bench.cli("submit", str(bench.wf_path), "--inputs-file", str(bench.inputs(1)))
    if submit.code != 0:
        raise RuntimeError(f"chordflow submit exited {submit.code}: {submit.stderr[-2000:]}")
    check_run(bench.cli("wait", submit.stdout.strip().splitlines()[-1]), 1)
    results.scale["submit_floor"] = submit
    log(f"submit N=1: {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")


def durable_scale(bench: Bench, n: int) -> dict[str, Any] | None:
    """`chordflow submit` + `chordflow wait` of an n-item batch; None when it took over SCALE_LIMIT."""
    path = bench.inputs(n)
    gc.collect()
    bench.peaks.reset()
    bench.tasks.mark()
    with RedisPeak(bench.redis) as redis_peak:
        wall = time.time()
        started = time.perf_counter()
        submit = bench.cli("submit", str(bench.wf_path), "--inputs-file", str(path))
        if submit.code != 0:
            raise RuntimeError(f"chordflow submit exited {submit.code}: {submit.stderr[-2000:]}")
        run_id = submit.stdout.strip().splitlines()[-1]
        log(f"submit N={n:,}: run {run_id} in {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")
        remaining = max(1.0, SCALE_LIMIT - (time.perf_counter() - started))
        waited = bench.cli("wait", run_id, "--timeout", f"{remaining:.0f}", limit=remaining + 120)
        seconds = time.perf_counter() - started
    if waited.code == 124:
        log(f"wait N={n:,}: not done after {SCALE_LIMIT} s; cancelling run {run_id}")
        bench.cli("cancel", run_id)
        with contextlib.suppress(Exception):
            from worker.cluster.app import current_app

            current_app().control.purge()
        time.sleep(2)
        forget_run(bench.redis, run_id)
        return None
    check_run(waited, n)
    workers = bench.peaks.read()
    log(f"submit + wait N={n:,}: {seconds:.3f} s; wait's peak rss {mb(waited.maxrss)}")
    rows_path = bench.workdir / "rows.jsonl"
    streamed = bench.cli("results", run_id, "--node", "b", "--out", str(rows_path))
    if streamed.code != 0:
        raise RuntimeError(f"chordflow results exited {streamed.code}: {streamed.stderr[-2000:]}")
    with rows_path.open("rb") as rows:
        lines = sum(1 for _ in rows)
    if lines != n:
        raise RuntimeError(f"chordflow results --node b wrote {lines} lines, expected {n}")
    log(f"results --node b N={n:,}: {streamed.seconds:.3f} s, peak rss {mb(streamed.maxrss)}")
    from worker.cluster.state.runs import ClusterRuns

    record = ClusterRuns().get(run_id)
    timeline = bench.tasks.read()
    forgotten = forget_run(bench.redis, run_id)
    return {
        "n": n,
        "seconds": seconds,
        "wall": wall,
        "timeline": timeline,
        "record": (record.created - wall, record.updated - wall) if record else None,
        "submit": submit,
        "wait": waited,
        "results": streamed,
        "results_bytes": rows_path.stat().st_size,
        "workers": workers,
        **redis_peak.as_dict(),
        "keys_deleted": forgotten,
    }


def client_scale(bench: Bench, n: int) -> dict[str, Any]:
    """The same batch through `scheduler.run(wf, backend="celery")` in this process (the client drives)."""
    import scheduler

    items = list(range(n))
    wf = workflow()
    gc.collect()
    bench.peaks.reset()
    bench.tasks.mark()
    with RedisPeak(bench.redis) as redis_peak, PeakRss() as rss, deadline(1800, f"scheduler.run N={n}"):
        wall = time.time()
        started = time.perf_counter()
        result = scheduler.run(wf, {"items": items}, backend="celery")
        seconds = time.perf_counter() - started
        ok = result.status == "success" and result.shared["b"]["success_count"] == n
        run_id = result.run_id
        del result
    if not ok:
        raise RuntimeError(f"scheduler.run N={n} did not succeed with {n} items")
    workers = bench.peaks.read()
    log(f"scheduler.run(backend='celery') N={n:,}: {seconds:.3f} s; rss +{mb(rss.increase)}")
    timeline = bench.tasks.read()
    forget_run(bench.redis, run_id)
    return {
        "n": n,
        "seconds": seconds,
        "wall": wall,
        "timeline": timeline,
        "rss_increase": rss.increase,
        "rss_method": rss.method,
        "workers": workers,
        **redis_peak.as_dict(),
    }


def scale(bench: Bench, results: Results) -> None:
    sizes = results.sizes
    submit_floor(bench, results)
    durable = durable_scale(bench, sizes.scale_n)
    if durable is None:
        results.scale["fell_back_from"] = sizes.scale_n
        durable = durable_scale(bench, sizes.fallback_n)
        if durable is None:
            raise RuntimeError(f"{sizes.fallback_n:,} items took over {SCALE_LIMIT} s as well")
    results.scale["durable"] = durable
    results.scale["client"] = client_scale(bench, durable["n"])
    results.scale["resettable"] = bench.peaks.resettable


# -- the report ------------------------------------------------------------------------------------------


def mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**FAIL**"


def spread(children: list[Child]) -> str:
    return ", ".join(f"{c.seconds:.2f}" for c in children)


def report(results: Results) -> str:
    sizes = results.sizes
    rows: list[tuple[str, str, str, str]] = []
    if results.celery_1 and results.local_1:
        celery = statistics.median(c.seconds for c in results.celery_1)
        local = statistics.median(c.seconds for c in results.local_1)
        rows += [
            (
                f"1-item batch, `chordflow run --backend local`, fresh process (median of {len(results.local_1)})",
                f"{local:.3f} s ({spread(results.local_1)})",
                "",
                "",
            ),
            (
                f"the same, `--backend celery` (median of {len(results.celery_1)})",
                f"{celery:.3f} s ({spread(results.celery_1)})",
                "",
                "",
            ),
            (
                "celery - local",
                f"{celery - local:+.3f} s",
                f"<= {LATENCY_BUDGET} s",
                verdict(celery - local <= LATENCY_BUDGET),
            ),
        ]
    if len(results.warm_runs) >= 2:
        first, warm = results.warm_runs[0], results.warm_runs[1]
        later = ", ".join(f"{c.seconds:.2f} s" for c in results.warm_runs[2:])
        rows += [
            (
                f"first {sizes.warm_n:,}-item run on fresh workers (`run --backend celery`, fresh process)",
                f"{first.seconds:.3f} s",
                "",
                "",
            ),
            (
                "the second (warm) one, fresh process",
                f"{warm.seconds:.3f} s" + (f" (third: {later})" if later else ""),
                "",
                "",
            ),
            (
                "first / warm",
                f"{first.seconds / warm.seconds:.2f}x",
                f"<= {FIRST_RATIO:g}x",
                verdict(first.seconds <= FIRST_RATIO * warm.seconds),
            ),
        ]
    durable, client = results.scale.get("durable"), results.scale.get("client")
    if durable and client:
        n = durable["n"]
        submit, waited = durable["submit"], durable["wait"]
        rows += [
            (
                f"{n:,}-item batch: `chordflow submit` + `chordflow wait` (submit start to wait end)",
                f"{durable['seconds']:.3f} s ({durable['seconds'] / n * 1e6:.1f} us/item)",
                "",
                "",
            ),
            (
                "of which `chordflow submit` (returns the run id)",
                f"{submit.seconds:.3f} s ({submit.cpu:.2f} s CPU)",
                "",
                "",
            ),
            ("of which `chordflow wait` (to the summary)", f"{waited.seconds:.3f} s ({waited.cpu:.2f} s CPU)", "", ""),
            (
                'the same in-process, `scheduler.run(wf, backend="celery")` (client-orchestrated)',
                f"{client['seconds']:.3f} s ({client['seconds'] / n * 1e6:.1f} us/item)",
                "",
                "",
            ),
            ("durable / client-orchestrated", f"{durable['seconds'] / client['seconds']:.2f}x", "", ""),
            ("where the durable run's time goes (seconds from submit start)", timeline_text(durable), "", ""),
            ("where the client-orchestrated run's time goes (seconds from its start)", timeline_text(client), "", ""),
            (
                "peak RSS of the `chordflow submit` process (whole process, GNU time %M)",
                mb(submit.maxrss),
                f"< {SUBMIT_RSS_MB} MB",
                verdict(submit.maxrss < SUBMIT_RSS_MB * 2**20),
            ),
            (
                "the same for a 1-item input (interpreter and imports)",
                mb(results.scale["submit_floor"].maxrss),
                "",
                "",
            ),
            ("peak RSS of the `chordflow wait` process", mb(waited.maxrss), "", ""),
            (
                f"`chordflow results RUN --node b --out FILE`: all {n:,} rows streamed to a file",
                f"{durable['results'].seconds:.3f} s ({mb(durable['results_bytes'])} written), "
                f"peak RSS {mb(durable['results'].maxrss)}",
                "",
                "",
            ),
            (
                "peak RSS increase of the `scheduler.run` process (this bench)",
                f"+{mb(client['rss_increase'])} ({client['rss_method']})",
                "",
                "",
            ),
            ("worker peak RSS (VmHWM), durable run", worker_text(durable["workers"]), "", ""),
            ("worker peak RSS (VmHWM), client-orchestrated run", worker_text(client["workers"]), "", ""),
            ("Redis peak memory, durable run", redis_text(durable), "", ""),
            ("Redis peak memory, client-orchestrated run", redis_text(client), "", ""),
        ]
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    notes = []
    fell = results.scale.get("fell_back_from")
    if fell:
        notes.append(
            f"- **The {fell:,}-item durable run did not finish within {SCALE_LIMIT} s on this machine**; it was "
            f"cancelled and the scale rows measure {durable['n'] if durable else '?':,} items instead."
        )
    floor = results.scale.get("submit_floor")
    if durable and floor is not None and durable["submit"].maxrss >= SUBMIT_RSS_MB * 2**20:
        extra = durable["submit"].maxrss - floor.maxrss
        notes.append(
            f"- The submitting client misses {SUBMIT_RSS_MB} MB because the items are an input: the same "
            f"`chordflow submit` with a 1-item input peaks at {mb(floor.maxrss)} (interpreter and imports), "
            f"and the {durable['n']:,} items add {mb(extra)}: the JSON file's text, the decoded list, the "
            "input check and the encoded store that goes to Redis are all in memory at once."
        )
    if results.scale and not results.scale.get("resettable", True):
        notes.append("- Worker VmHWM could not be reset between phases: the worker rows are lifetime peaks.")
    if results.fingerprint_end != results.fingerprint_start:
        notes.append("- **chordflow's sources changed while the bench ran**: the numbers mix two versions.")
    facts = "\n".join(f"| {k} | {v} |" for k, v in results.facts.items())
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(results.started))
    return f"""# Durable runs: latency and scale

`python -m bench.durable{" --quick" if results.quick else ""}` ({when}, {results.duration:.0f} s in all).
Sources: {results.fingerprint_start}.

| measurement | result | target | |
|---|---|---|---|
{table}

{chr(10).join(notes)}

## Method

- One `scheduler.localcluster.Cluster`: its own `redis-server` on a free port and two solo workers
  (`celery -A worker.app worker -P {POOL} -c 1`, as `python -m bench`), started by this bench and stopped
  in a `finally`. The workflow is one `echo` batch node, params `{{"v": "${{item}}"}}`, over the input
  `items` = `[0, 1, ..., N-1]`, passed with `--inputs-file` (JSON written before the timing).
- Every `chordflow` command is a fresh subprocess (`{shlex.join(chordflow())}`); wall time is measured
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
  both workers. CPU of the CLI processes is their rusage (user + system).

## Machine

| fact | value |
|---|---|
{facts}

Command: `{results.command}`
"""


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


def redis_text(phase: dict[str, Any]) -> str:
    """used_memory_peak when this run raised Redis's lifetime peak (then it is this run's exact peak);
    else the 10 ms sampler's maximum of used_memory. Both beside used_memory when the run started."""
    sampled = f"sampled every 10 ms: {mb(phase['redis_sampled'])}"
    if phase["redis_lifetime"] > phase["redis_lifetime_before"]:
        text = f"{mb(phase['redis_lifetime'])} (used_memory_peak; {sampled}"
    else:
        text = f"{mb(phase['redis_sampled'])} (sampled every 10 ms; the lifetime peak was set earlier"
    return text + f"; used_memory {mb(phase['redis_before'])} at the start)"


def worker_text(workers: dict[int, int]) -> str:
    return ", ".join(f"{mb(v)} (pid {pid})" for pid, v in workers.items()) + f"; max {mb(max(workers.values()))}"


def machine_facts(bench: Bench | None) -> dict[str, str]:
    import platform

    facts = {
        "cores (os.cpu_count)": str(os.cpu_count()),
        "memory": mb(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")).replace(" MB", " MB total"),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if bench is not None and bench.redis is not None:
        server = bench.redis.info("server")
        facts["redis-server"] = f"{server.get('redis_version')} ({bench.cluster.redis.url}, started by the bench)"
        facts["workers"] = f"{len(WORKERS)} x `-P {POOL} -c 1` (pids {', '.join(str(p) for p in bench.peaks.pids())})"
    return facts


def command_line(module: str) -> str:
    """The command that ran this bench (`python -m <module> ...`), from the directory it ran in: the report's."""
    argv = getattr(sys, "orig_argv", [sys.executable, "-m", module, *sys.argv[1:]])
    return f"cd {shlex.quote(str(Path.cwd()))} && " + shlex.join(argv)


def finish(results: Any, report_of: Callable[[Any], str], path: Path, t0: float) -> None:
    """The end of a bench's run (its `results` have `duration`, `fingerprint_end` and `facts`): the load at the
    end, then its report written to `path` and printed."""
    from bench.run import fingerprint

    results.duration = time.perf_counter() - t0
    results.fingerprint_end = fingerprint()
    results.facts["load average at end (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    path.parent.mkdir(parents=True, exist_ok=True)
    text = report_of(results)
    path.write_text(text)
    print(text)


def keep_or_remove(workdir: Path, keep: bool) -> None:
    """The bench's working directory (redis and worker logs): kept with --keep-logs, else removed."""
    if keep:
        log(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.durable", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--out", type=Path, default=HERE, help="where DURABLE.md goes (default: bench/)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the redis/worker logs directory")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.run import fingerprint

    args = parse_args(argv)
    results = Results(QUICK if args.quick else FULL, args.quick, started=time.time())
    results.command = command_line("bench.durable")
    results.fingerprint_start = fingerprint()
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="chordflow-durable-"))
    bench = Bench(workdir)
    try:
        bench.start()
        results.facts = machine_facts(bench)
        first_and_warm(bench, results)  # first: the workers must not have run anything yet
        latency(bench, results)
        scale(bench, results)
    finally:
        bench.stop()
        if not results.facts:
            results.facts = machine_facts(None)
    finish(results, report, args.out / "DURABLE.md", t0)
    keep_or_remove(workdir, args.keep_logs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
