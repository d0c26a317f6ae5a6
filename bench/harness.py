"""What every bench runs in, written once: its command line, a throwaway cluster, child processes measured
from outside, and a report that says which code ran on which machine.

A bench module gives `run_bench` two functions, one that measures and one that renders the results as
markdown; the harness owns the rest (working directory, `CHORDFLOW_HOME`, the cluster's start and stop,
source fingerprints, writing the report), so every bench's `main()` is the same few lines.

Internal modules it uses beyond the public API: `scheduler.localcluster`, `worker.cluster.app`,
`worker.cluster.state.keys`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.metadata
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import CpuUse, RedisPeak, WorkerLogs, WorkerPeaks, process_tree
from scheduler.localcluster import Cluster, restore_env
from worker.cluster.state.keys import RunKeys

HERE = Path(__file__).resolve().parent
WORKERS = ("w1", "w2")  # two solo workers = 2 worker processes, the same for every bench
POOL = "solo"
CONCURRENCY = 1


def log(message: str) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- child processes ------------------------------------------------------------------------------------------
@dataclass
class Child:
    argv: list[str]
    seconds: float
    maxrss: int  # bytes: the child's own peak RSS
    code: int
    stdout: str
    stderr: str
    cpu: float = 0.0  # seconds of CPU (user + system) the child used

    def failure(self) -> RuntimeError:
        output = f"{self.stdout[-2000:]}\n{self.stderr[-2000:]}"
        return RuntimeError(f"{shlex.join(self.argv)} exited {self.code}:\n{output}")

    def last_line(self) -> str:
        """What `submit` prints last (the run id), or a `--output json` report; raises when there is none."""
        lines = self.stdout.strip().splitlines()
        if self.code != 0 or not lines:
            raise self.failure()
        return lines[-1]


def chordflow() -> list[str]:
    script = Path(sys.executable).with_name("chordflow")
    return [str(script)] if script.exists() else [sys.executable, "-m", "scheduler.cli"]


#: Linux carries a process's peak RSS across exec: a child forked from this (large) bench process reports at
#: least the bench's own RSS from wait4. GNU time, small itself, forks the measured command and reports its
#: true peak (`%M`, KB) on the last line of stderr.
TIME = shutil.which("time") or "/usr/bin/time"
MAXRSS_MARK = "chordflow-bench-maxrss-kb="


def run_child(argv: list[str], env: dict[str, str], workdir: Path, limit: float = 1800) -> Child:
    """Run argv to its end: wall time, exit code, output, CPU and its own peak RSS (GNU time's when present, else
    wait4's). It runs in its own session: past `limit` seconds the whole group is killed (exit code -9)."""
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
        stderr, maxrss = err.read(), usage.ru_maxrss * 1024
        if measured and MAXRSS_MARK in stderr:
            stderr, _, kb = stderr.rpartition(MAXRSS_MARK)
            maxrss = int(kb.strip()) * 1024
        return Child(argv, seconds, maxrss, proc.returncode, out.read(), stderr, usage.ru_utime + usage.ru_stime)


# -- the throwaway cluster -------------------------------------------------------------------------------------
class BenchCluster:
    """Its own redis-server on a free port and `workers` solo Celery workers (scheduler.localcluster), never the
    machine's shared Redis. This process is pointed at it until `stop()`; the cluster's env holds a random
    signing key, so this process and the workers sign and verify every task message.

    `plugins`: what the workers import (CHORDFLOW_PLUGINS); `needed`: task names every worker must have
    registered before anything is timed. `env` is for CLI children: the cluster's, with the caller's own
    plugins (a user's `chordflow` loads no bench module)."""

    def __init__(self, workdir: Path, plugins: str = "", workers: Sequence[str] = WORKERS, needed: Sequence[str] = ()):
        import redis

        self.cluster = Cluster(workdir, plugins=plugins)
        self.previous: dict[str, str | None] = {}
        log(f"redis-server on {self.url} (pid {self.cluster.redis.pid}); logs in {workdir}")
        try:
            for name in workers:
                worker = self.cluster.start_worker(name, pool=POOL, concurrency=CONCURRENCY)
                log(f"worker {name}: -P {POOL} -c {CONCURRENCY} (pid {worker.pid}) ready")
            self.previous = self.cluster.apply_env()
            self.redis = redis.Redis.from_url(self.url)
            self.processes = self.check(needed) if needed else len(workers) * CONCURRENCY
        except BaseException:
            self.stop()
            raise
        self.logs = WorkerLogs([w.log for w in self.cluster.workers.values()])
        self.peaks = WorkerPeaks(self.pids)
        self.side_pids: list[int] = []  # another side's workers (a baseline's), measured as these are
        self.env = {**self.cluster.env, "CHORDFLOW_PLUGINS": os.environ.get("CHORDFLOW_PLUGINS", ""), "COLUMNS": "200"}

    @property
    def url(self) -> str:
        return self.cluster.redis.url

    @property
    def workdir(self) -> Path:
        return self.cluster.workdir

    def cli(self, *args: str, limit: float = 1800) -> Child:
        """A `chordflow` command, a fresh process with the cluster's env."""
        return run_child([*chordflow(), *args], self.env, self.workdir, limit)

    def write(self, name: str, text: str) -> Path:
        """A file in the working directory (written before any timing)."""
        path = self.workdir / name
        if not path.exists():
            path.write_text(text)
        return path

    def check(self, needed: Sequence[str]) -> int:
        """Every worker registered `needed`; returns the worker processes they run in all."""
        from worker.cluster.app import current_app

        app, count = current_app(), len(self.cluster.workers)
        if app.conf.broker_url != self.url:
            raise RuntimeError(f"the Celery app points at {app.conf.broker_url}, not the bench's {self.url}")
        registered = app.control.inspect(timeout=2.0, limit=count).registered() or {}
        stats = app.control.inspect(timeout=2.0, limit=count).stats() or {}
        problems = []
        for name in self.cluster.workers:
            key = next((k for k in registered if k.startswith(f"{name}@")), None)
            missing = set(needed) - set(registered.get(key, ()))
            if key is None or missing:
                problems.append(f"{name}: missing {sorted(missing) if key else 'no reply'}")
        if problems:
            raise RuntimeError("workers did not register the bench's tasks: " + "; ".join(problems))
        processes = sum(int(s.get("pool", {}).get("max-concurrency", 1)) for s in stats.values())
        log(f"workers registered {', '.join(sorted(needed))}; {processes} worker processes in all")
        return processes

    def pids(self) -> list[int]:
        mine = [pid for worker in self.cluster.workers.values() for pid in process_tree(worker.pid)]
        return mine + [pid for side in self.side_pids for pid in process_tree(side)]

    def delete(self, pattern: str) -> int:
        keys = list(self.redis.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])
        return len(keys)

    def forget(self, run_id: str | None, task_results: bool = False) -> int:
        """Delete a run's keys (and the Celery task results), so the next phase's memory starts clean."""
        deleted = self.delete(RunKeys(run_id).prefix + "*") if run_id else 0
        return deleted + (self.delete("celery-task-meta-*") if task_results else 0)

    def purge(self) -> None:
        """Leave no half-run job's messages in the queue for the next phase."""
        from worker.cluster.app import current_app

        with contextlib.suppress(Exception):
            current_app().control.purge()

    def facts(self) -> dict[str, str]:
        server = self.redis.info("server")
        facts = {"redis-server": f"{server.get('redis_version')} ({self.url}, started by the bench)"}
        if self.cluster.workers:
            pids = ", ".join(str(p) for p in self.pids())
            facts["workers"] = (
                f"{len(self.cluster.workers)} x `celery -A worker.app worker -P {POOL} -c {CONCURRENCY} -l info "
                f"--without-mingle --without-gossip` = {self.processes} worker processes (pids {pids})"
            )
        return facts

    def stop(self) -> None:
        if "worker.cluster.app" in sys.modules:  # its result consumer unsubscribes: let it, while Redis is up
            with contextlib.suppress(Exception):
                sys.modules["worker.cluster.app"].current_app().backend.result_consumer.stop()
        self.cluster.stop()
        self.cluster.restore_env(self.previous)
        log("cluster stopped (redis-server and workers)")


class Phase:
    """One phase measured on the cluster, from outside: wall time, worker peak RSS (reset at the start), Redis
    memory sampled every 10 ms, CPU of everything; the workers' log lines are marked at the start."""

    def __init__(self, bench: BenchCluster):
        self.bench = bench
        self.redis = RedisPeak(bench.redis)
        self.cpu = CpuUse(bench.pids, bench.cluster.redis.pid)
        self.wall = self.t0 = self.seconds = 0.0
        self.workers: dict[int, int] = {}

    def __enter__(self) -> Phase:
        gc.collect()
        self.bench.peaks.reset()
        self.bench.logs.mark()
        self.redis.__enter__()
        self.cpu.__enter__()
        self.wall, self.t0 = time.time(), time.perf_counter()
        return self

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __exit__(self, *exc: object) -> None:
        self.seconds = self.elapsed()
        self.cpu.__exit__()
        self.redis.__exit__()
        self.workers = self.bench.peaks.read()

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "wall": self.wall,
            "workers": self.workers,
            "worker_cpu": self.cpu.used["workers"],
            "cpu": self.cpu.text(),
            "cpu_used": dict(self.cpu.used),
            **self.redis.as_dict(),
        }


# -- which code ran, on which machine ------------------------------------------------------------------------
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


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


#: (fact, distribution) of the libraries the numbers depend on.
PACKAGES = (("celery", "celery"), ("kombu", "kombu"), ("redis (redis-py)", "redis"), ("msgpack", "msgpack"))
PACKAGES += (("pocketflow", "pocketflow"), ("psutil", "psutil"))


def machine_facts(cluster: BenchCluster | None = None) -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    facts = {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu or platform.processor() or "unknown",
        "memory": f"{mb(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))} total",
        "os": platform.platform(),
        "python": platform.python_version(),
        **{name: version(dist) for name, dist in PACKAGES},
        "load average at start (1/5/15 min)": load_average(),
    }
    return {**facts, **(cluster.facts() if cluster is not None else {})}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


# -- a bench's command line and session --------------------------------------------------------------------
def arguments(
    module: str,
    doc: str,
    report: str | None,
    quick: str,
    argv: list[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> argparse.Namespace:
    """Every bench's options: --quick (what it shrinks to), --out (where `report` goes), --keep-logs."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick)
    if report:
        parser.add_argument("--out", type=Path, default=HERE, help=f"where {report} goes (default: bench/)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the redis/worker logs directory")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    args.module, args.report = module, report
    return args


@dataclass
class Session:
    """One bench run: its arguments, the command that started it, when, how long, on which code and machine."""

    args: argparse.Namespace
    started: float = field(default_factory=time.time)
    t0: float = field(default_factory=time.perf_counter)
    fingerprint_start: str = field(default_factory=fingerprint)
    fingerprint_end: str = ""
    duration: float = 0.0
    facts: dict[str, str] = field(default_factory=dict)
    workdir: Path = Path()

    @property
    def quick(self) -> bool:
        return self.args.quick

    @property
    def invocation(self) -> str:
        return f"python -m {self.args.module}" + (" --quick" if self.quick else "")

    @property
    def command(self) -> str:
        """The command that ran this bench, from the directory it ran in."""
        argv = getattr(sys, "orig_argv", [sys.executable, "-m", self.args.module, *sys.argv[1:]])
        return f"cd {shlex.quote(str(Path.cwd()))} && " + shlex.join(argv)

    @property
    def moved(self) -> bool:
        return self.fingerprint_end != self.fingerprint_start

    def finish(self) -> None:
        self.duration = time.perf_counter() - self.t0
        self.fingerprint_end = fingerprint()
        self.facts["load average at end (1/5/15 min)"] = load_average()
        if self.moved:
            log("WARNING: chordflow's sources changed while the bench ran; the results mix two versions")


# -- the report ----------------------------------------------------------------------------------------------
def mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], align: str = "") -> str:
    """A markdown table; `align` has a letter per column, `r` for right-aligned (numbers)."""
    marks = ("---:" if a == "r" else "---" for a in align.ljust(len(head), "l"))
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(marks) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


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


def document(session: Session, title: str, body: str) -> str:
    """A report: what ran (command, date, sources), the bench's own body, then the machine."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(session.started))
    moved = (
        f"\n**chordflow's sources changed while the bench ran** (at the end: {session.fingerprint_end}): the "
        "numbers mix two versions; processes started before the change ran the old code."
        if session.moved
        else ""
    )
    return (
        f"# {title}\n\n`{session.invocation}` ({when}, {session.duration:.0f} s in all).\n"
        f"Sources: {session.fingerprint_start}.{moved}\n\n{body.strip()}\n\n"
        f"## Machine\n\n{table(('fact', 'value'), session.facts.items())}\n\nCommand: `{session.command}`\n"
    )


# -- running a bench ------------------------------------------------------------------------------------------
def run_bench(
    args: argparse.Namespace,
    measure: Callable[[Session, BenchCluster], Any],
    render: Callable[[Session, Any], str] | None = None,
    **cluster: Any,
) -> Any:
    """Measure on a fresh cluster (`cluster`: BenchCluster's options), in a temp working directory and
    `CHORDFLOW_HOME` (never ~/.chordflow); stop it; then write `render`'s report to --out and print it."""
    session = Session(args)
    session.workdir = Path(tempfile.mkdtemp(prefix=f"chordflow-{args.module.rpartition('.')[2]}-"))
    home = session.workdir / "home"  # the embedded store of local runs
    home.mkdir()
    previous_home = os.environ.get("CHORDFLOW_HOME")
    os.environ["CHORDFLOW_HOME"] = str(home)
    bench = None
    try:
        bench = BenchCluster(session.workdir, **cluster)
        session.facts = machine_facts(bench)
        results = measure(session, bench)
    except BaseException:
        log(f"failed: no report written; logs kept in {session.workdir}")
        raise
    finally:
        if bench is not None:
            bench.stop()
        restore_env({"CHORDFLOW_HOME": previous_home})
    session.finish()
    if render is not None and args.report:
        path = args.out / args.report
        path.parent.mkdir(parents=True, exist_ok=True)
        text = render(session, results)
        path.write_text(text)
        print(text)
        log(f"wrote {path} ({session.duration:.0f} s in all)")
    if args.keep_logs:
        log(f"logs kept in {session.workdir}")
    else:
        shutil.rmtree(session.workdir, ignore_errors=True)
    return results
