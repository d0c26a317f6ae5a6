"""`python -m bench.datasets`: the scale check of dataset jobs.

A two-node workflow once per record of a JSONL file, through `chordflow submit WF.json --items FILE`,
`chordflow wait RUN` and `chordflow results RUN --out FILE` (every row in a file), at 1,000,000 and at 100,000
records (the client's memory must not grow with the file), on its own cluster (bench/harness.py: a redis-server
on a free port and two solo workers). For each: wall time to the rows in the file, the submitting client's peak
RSS (target: < 150 MB at 1,000,000), the workers' peak RSS, Redis's peak memory and what the job leaves in it,
the time to the first readable result; then the same job as one command, `chordflow run WF --items FILE
--backend celery --out FILE` (the rows written as the chunks finish).

Beside it, in the same run, in paired rounds at the small size: a stock Celery group as a user writes it by hand
(bench/stock_group.py: its own Celery app and workers, no chordflow code; read the file, a `group` of tasks over
chunks of 500 records, each running the workflow's two steps as two PocketFlow nodes per record,
`GroupResult.get()`, the rows written to a file); the local backend (`chordflow run WF --items FILE` +
`chordflow results RUN --out FILE`, and `chordflow run WF --items FILE --out FILE`) against a plain PocketFlow
loop over the file writing the same rows; and a local batch of no-op items against a plain PocketFlow loop
keeping every item's result.

Writes bench/DATASETS.md (or --out). Progress lines go to stderr.

Internal modules it uses beyond the public API: `worker.cluster.state.keys`, `worker.cluster.state.runs`,
`worker.datasets.job`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import harness, stock_group
from bench.harness import BenchCluster, Child, Phase, Session, log, mb
from bench.measure import CpuUse
from worker.cluster.state.keys import RUNS, RunKeys
from worker.datasets.job import DEFAULT_CHUNK_SIZE

CHUNK = DEFAULT_CHUNK_SIZE  # records per chunk of chordflow's jobs: its default
STOCK_CHUNK = stock_group.CHUNK  # records per task of the stock group: as its user wrote it
#: Paired rounds of the one command against the stock group given tasks of chordflow's chunk size (not a target).
SAME_CHUNK_ROUNDS = 3
SUBMIT_RSS_MB = 150  # target: the submitting client's peak RSS at the large N
LIMIT = 1800  # seconds: any one child process (a job, the baseline) is killed past this
POLL = 0.005  # seconds between two looks for the first result
TEXT = "some short text"


@dataclass(frozen=True)
class Sizes:
    large: int  # records in the large job
    small: int  # the small one: same measurements, to show the client's memory does not grow
    warm: int  # an untimed job first on each side (the workers' first-chunk costs)
    rounds: int  # paired rounds at the small size: the stock group, then chordflow's forms, in turns


FULL = Sizes(large=1_000_000, small=100_000, warm=2_000, rounds=7)
QUICK = Sizes(large=20_000, small=5_000, warm=500, rounds=2)


def workflow() -> dict[str, Any]:
    """Two built-in nodes per record: `a` echoes the record's id and text, `b` echoes a's id."""
    return {
        "ir_version": "0.1.0",
        "name": "datasets_bench",
        "inputs": {"record": {"description": "one record of the file: {id, text}"}},
        "nodes": [
            {"id": "a", "type": "echo", "params": {"id": "${record.id}", "text": "${record.text}"}},
            {"id": "b", "type": "echo", "params": {"n": "${a.id}"}},
        ],
        "outputs": {"id": {"source": "${b.n}"}},
    }


# -- checks ------------------------------------------------------------------------------------------------
def check_job(child: Child, n: int) -> dict[str, Any]:
    """`wait`/`run --output json` of a dataset job: it succeeded with all n records done."""
    try:
        report = json.loads(child.last_line())
    except ValueError:
        raise child.failure() from None
    if report["status"] != "success" or report["outputs"] != {"total": n, "done": n, "failed": 0}:
        raise child.failure()
    return report


def check_rows(path: Path, n: int) -> bool:
    """The results file has n lines, line i being record i's row `{"index": i, "result": {"id": i}, ...}`."""
    count = 0
    with path.open("rb") as rows:
        for i, line in enumerate(rows):
            row = json.loads(line)
            if row["index"] != i or row["result"] != {"id": i} or row["error"] is not None:
                return False
            count += 1
    return count == n


class FirstResult:
    """When `chordflow results RUN --done` would first print a line: polls the bench's Redis from submit start
    for the new run id (the `cf:runs` index), then for the first field of its `cf:{run}:ds:out` hash (a
    finished chunk's outcomes, what `--done` prints). Then runs that command once to confirm."""

    def __init__(self, bench: BenchCluster):
        import redis

        self.bench = bench
        self.redis = redis.Redis.from_url(bench.url)
        self.known = {r.decode() for r in self.redis.zrange(RUNS, 0, -1)}
        self.t0 = 0.0
        self.run_id: str | None = None
        self.seconds: float | None = None
        self.confirm: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join()
        self.redis.close()

    def _poll(self) -> None:
        while self.seconds is None and not self._stop.wait(POLL):
            if self.run_id is None:
                new = [r.decode() for r in self.redis.zrange(RUNS, 0, -1) if r.decode() not in self.known]
                self.run_id = new[0] if new else None
            if self.run_id is not None and self.redis.hlen(RunKeys(self.run_id).dataset.out):
                self.seconds = time.perf_counter() - self.t0
        if self.seconds is not None:
            path = self.bench.workdir / "done.jsonl"
            child = self.bench.cli("results", str(self.run_id), "--done", "--out", str(path), limit=LIMIT)
            with path.open("rb") as rows:
                lines = sum(1 for _ in rows)
            self.confirm = {"child": child, "lines": lines, "at": time.perf_counter() - self.t0}


# -- the measurements ----------------------------------------------------------------------------------------
@dataclass
class Results:
    sizes: Sizes
    floor: Child | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    baseline: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)  # {"stock", "job", "local"} of one paired round
    #: {"stock", "one"}: the stock group with tasks of chordflow's chunk size, paired with the one command
    same_chunks: list[dict[str, Any]] = field(default_factory=list)
    stock: list[str] = field(default_factory=list)  # how the stock group's workers were started
    local: dict[str, Any] = field(default_factory=dict)
    noop: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Child] = field(default_factory=dict)
    resettable: bool = True


def measure(session: Session, bench: BenchCluster) -> Results:
    sizes = QUICK if session.quick else FULL
    byte_compiled = precompile()
    log(f"sources byte-compiled: {byte_compiled}")
    results, jobs = Results(sizes), Jobs(bench)
    for n in (sizes.large, sizes.small):
        jobs.records(n)
    log(f"records files written: {sizes.large:,} and {sizes.small:,} lines")
    with StockWorkers(bench) as stock:
        results.stock = ["celery", *stock.argv[1:]]  # as a user types it (the venv's `celery`)
        results.floor = jobs.untimed(1)  # the submitting client's RSS floor (interpreter and imports)
        log(f"submit of 1 record: {results.floor.seconds:.3f} s, client peak rss {mb(results.floor.maxrss)}")
        jobs.untimed(sizes.warm)  # the workers' first-chunk costs (imports, connections) are in no row
        jobs.baseline(sizes.warm)  # the same for the stock workers
        log(f"warm-up jobs of {sizes.warm:,} records done (chordflow and the stock group)")
        results.startup = jobs.startup()
        log("start-up, 1 record: " + ", ".join(f"{k} {child.seconds:.3f} s" for k, child in results.startup.items()))
        for r in range(sizes.rounds):  # paired: the two sides back to back, taking turns at going first
            log(f"round {r + 1} of {sizes.rounds}, {sizes.small:,} records")
            one_round: dict[str, Any] = {}
            sides = [("stock", lambda: jobs.baseline(sizes.small)), ("job", lambda: jobs.job(sizes.small))]
            for name, body in sides if r % 2 == 0 else sides[::-1]:
                one_round[name] = body()
            one_round["local"] = jobs.local(sizes.small)
            results.rounds.append(one_round)
        for r in range(SAME_CHUNK_ROUNDS):  # not a target: the baseline as a user who chose chordflow's size
            log(f"same-size round {r + 1} of {SAME_CHUNK_ROUNDS}: the stock group's tasks of {CHUNK:,} records")
            pair: dict[str, Any] = {}
            sides = [
                ("stock", lambda: jobs.baseline(sizes.small, CHUNK)),
                ("one", lambda: jobs.one_command(sizes.small, [])),
            ]
            for name, body in sides if r % 2 == 0 else sides[::-1]:
                pair[name] = body()
            results.same_chunks.append(pair)
        if not session.args.small_only:
            results.jobs.append(jobs.job(sizes.large, watch=True))
            results.baseline.append(jobs.baseline(sizes.large))
    results.jobs += [jobs.job(sizes.small, size) for size in session.args.chunk_size]
    results.noop = noop_batch(sizes.small)
    results.resettable = bench.peaks.resettable
    return results


class StockWorkers:
    """The stock group's two workers, `celery -A bench.stock_group worker -P solo` as a user starts them, on the
    bench's redis-server (its database 1, so that neither side's workers or control messages see the other's);
    their pids join the bench's worker pids (CPU, peak RSS) while they run."""

    def __init__(self, bench: BenchCluster):
        self.bench = bench
        self.url = bench.url.rsplit("/", 1)[0] + "/1"
        self.env = {**os.environ, "STOCK_REDIS_URL": self.url, "PYTHONPATH": str(harness.HERE.parent)}
        celery = str(Path(sys.executable).with_name("celery"))
        self.argv = [celery, "-A", "bench.stock_group", "worker", "-P", "solo"]
        self.procs: list[Any] = []

    def __enter__(self) -> StockWorkers:
        import subprocess

        os.environ["STOCK_REDIS_URL"] = self.url  # this process pings them through the module's app
        from bench.stock_group import app

        app.conf.broker_url = app.conf.result_backend = self.url
        names = [f"stock{i}@{socket.gethostname()}" for i in (1, 2)]
        for name in names:
            log_file = (self.bench.workdir / f"worker-{name.split('@')[0]}.log").open("w")
            argv = [*self.argv, "-n", name]
            self.procs.append(
                subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
            )
        self.bench.side_pids = [p.pid for p in self.procs]
        deadline = time.monotonic() + 60
        while {r for reply in app.control.ping(destination=names, timeout=1.0) for r in reply} != set(names):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.__exit__()
                raise RuntimeError(f"the stock group's workers did not start; see {self.bench.workdir}")
        log(f"stock workers {', '.join(names)} ready (pids {', '.join(str(p.pid) for p in self.procs)})")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.bench.side_pids = []


def precompile() -> bool:
    """Byte-compile the sources, untimed, as `pip install` does: under PYTHONDONTWRITEBYTECODE=1 (this machine's
    environment) no `chordflow` command ever writes its .pyc, and each would compile ~120 modules again
    (0.16 s of CPU); a .pyc that exists is read whatever that variable says."""
    import compileall

    root = harness.HERE.parent
    return all(compileall.compile_dir(root / name, quiet=1) for name in ("ir", "scheduler", "worker", "bench"))


class Jobs:
    """The dataset jobs, the baseline and the local run, over records files of N lines on the bench's cluster.
    The workers import this module (the baseline's task); the `chordflow` commands do not."""

    def __init__(self, bench: BenchCluster):
        self.bench = bench
        self.wf = str(bench.write("wf.json", json.dumps(workflow())))

    def records(self, n: int) -> str:
        """A JSONL file of n records `{"id": i, "text": ...}` (written once, before any timing)."""
        path = self.bench.workdir / f"records-{n}.jsonl"
        if not path.exists():
            with path.open("w", encoding="utf-8") as f:
                for start in range(0, n, 10_000):
                    f.writelines(f'{{"id": {i}, "text": "{TEXT}"}}\n' for i in range(start, min(n, start + 10_000)))
        return str(path)

    def untimed(self, n: int) -> Child:
        """A job of n records submitted and waited for, outside any timing; returns its `submit`."""
        submit = self.bench.cli("submit", self.wf, "--items", self.records(n), limit=LIMIT)
        run_id = submit.last_line()
        check_job(self.bench.cli("wait", run_id, "--output", "json", limit=LIMIT), n)
        self.bench.forget(run_id, task_results=True)
        return submit

    def startup(self, rounds: int = 3) -> dict[str, Child]:
        """Each command of the jobs below on a 1-record file, and the bare interpreter: the best of `rounds` runs
        of each (by wall time), what a command costs before its records (interpreter, imports, connections)."""
        one, rows = self.records(1), str(self.bench.workdir / "startup.jsonl")
        best: dict[str, Child] = {}

        def timed(name: str, argv: list[str]) -> Child:
            child = harness.run_child(argv, self.bench.env, self.bench.workdir, LIMIT)
            if child.code != 0:
                raise child.failure()
            if name not in best or child.seconds < best[name].seconds:
                best[name] = child
            return child

        command = harness.chordflow()
        for _ in range(rounds):
            timed("python -c pass (the interpreter)", [sys.executable, "-c", "pass"])
            run_id = timed("submit", [*command, "submit", self.wf, "--items", one]).last_line()
            timed("wait --output json", [*command, "wait", run_id, "--output", "json"])
            timed("results --out", [*command, "results", run_id, "--out", rows])
            self.bench.forget(run_id, task_results=True)
            local_run = [*command, "run", self.wf, "--items", one, "--output", "json"]
            local = timed("local: run --items --output json", local_run)
            timed("local: results --out", [*command, "results", check_job(local, 1)["run_id"], "--out", rows])
        return best

    def job(self, n: int, chunk_size: int | None = None, watch: bool = False) -> dict[str, Any]:
        """`chordflow submit WF --items FILE`, `chordflow wait RUN`, `chordflow results RUN --out FILE`, timed from
        submit start to the rows in the file; then the one-command form (`one_command`). `watch`: a thread polls
        for the first readable result meanwhile (`FirstResult`, a process of its own on the same cores)."""
        from worker.cluster.state.runs import ClusterRuns

        bench, path = self.bench, self.records(n)
        extra = ["--chunk-size", str(chunk_size)] if chunk_size else []
        rows_path = bench.workdir / "results.jsonl"
        first = FirstResult(bench)
        try:
            with Phase(bench) as phase:
                if watch:
                    first.start(phase.t0)
                submit = bench.cli("submit", self.wf, "--items", path, *extra, limit=LIMIT)
                run_id = submit.last_line()
                log(f"submit {n:,} records: run {run_id}, {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")
                waited = bench.cli("wait", run_id, "--output", "json", limit=LIMIT)
                wait_end = phase.elapsed()
                streamed = bench.cli("results", run_id, "--out", str(rows_path), limit=LIMIT)
        finally:
            first.stop()
        check_job(waited, n)
        if streamed.code != 0:
            raise streamed.failure()
        left = self.left(run_id)
        record = ClusterRuns().get(run_id)
        seen = "never" if first.seconds is None else f"{first.seconds:.3f} s"
        log(f"job of {n:,} records: {phase.seconds:.3f} s ({n / phase.seconds:,.0f} records/s); first result {seen}")
        ordered = check_rows(rows_path, n)
        size = rows_path.stat().st_size
        rows_path.unlink()
        log(f"results --out {n:,} rows: {streamed.seconds:.3f} s, peak rss {mb(streamed.maxrss)}, in order: {ordered}")
        timeline = bench.logs.tasks()
        bench.forget(run_id, task_results=True)
        return {
            **phase.as_dict(),
            "n": n,
            "chunk_size": chunk_size or CHUNK,
            "submit": submit,
            "wait": waited,
            "wait_end": wait_end,
            "record_final": record.updated - phase.wall if record else None,
            "first": first.seconds,
            "watched": watch,
            "confirm": first.confirm,
            "results": streamed,
            "results_bytes": size,
            "ordered": ordered,
            "left": left,
            "timeline": timeline,
            "one": self.one_command(n, extra),
        }

    def one_command(self, n: int, extra: list[str]) -> dict[str, Any]:
        """`chordflow run WF --items FILE --backend celery --out FILE`: the same job as one process, its rows
        written as its chunks finish."""
        rows_path = self.bench.workdir / "results-one.jsonl"
        argv = ["run", self.wf, "--items", self.records(n), *extra, "--backend", "celery", "--out", str(rows_path)]
        with Phase(self.bench) as phase:
            child = self.bench.cli(*argv, "--output", "json", limit=LIMIT)
        run_id = check_job(child, n)["run_id"]
        ordered = check_rows(rows_path, n)
        rows_path.unlink()
        log(f"run --backend celery --out, {n:,} records: {phase.seconds:.3f} s, in order: {ordered}")
        self.bench.forget(run_id, task_results=True)
        return {**phase.as_dict(), "child": child, "ordered": ordered}

    def left(self, run_id: str) -> dict[str, Any]:
        """What a finished job leaves in Redis: used_memory, its own keys (and their MEMORY USAGE), the
        Celery task results."""
        keys = RunKeys(run_id)
        client, prefix = self.bench.redis, keys.prefix
        run_keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        usage = {k.decode().removeprefix(prefix): client.memory_usage(k, samples=0) or 0 for k in run_keys}
        metas = list(client.scan_iter(match="celery-task-meta-*", count=1000))
        meta_usage = sum(client.memory_usage(k) or 0 for k in metas)
        ttl = client.ttl(keys.dataset.out)
        used = int(client.info("memory")["used_memory"])
        return {"used": used, "usage": usage, "task_results": len(metas), "meta_usage": meta_usage, "ttl": ttl}

    def baseline(self, n: int, chunk: int | None = None) -> dict[str, Any]:
        """The stock group's client (bench/stock_group.py) in its own process, over the same file; `chunk`: records
        per task other than its own CHUNK."""
        rows_path = self.bench.workdir / "baseline.jsonl"
        argv = [sys.executable, "-m", "bench.stock_group", self.records(n), str(rows_path)]
        env = {**os.environ, "PYTHONPATH": str(harness.HERE.parent)}  # STOCK_REDIS_URL: StockWorkers set it
        if chunk:
            env["STOCK_CHUNK"] = str(chunk)
        with Phase(self.bench) as phase:
            child = harness.run_child(argv, env, self.bench.workdir, LIMIT)
        phases: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            phases = json.loads(child.stdout.strip().splitlines()[-1])
        phases["ok"] = bool(phases) and check_rows(rows_path, n)
        rows_path.unlink(missing_ok=True)
        if child.code != 0 or not phases.get("ok"):
            log(f"baseline {n:,} records did not complete: exit {child.code}, peak rss {mb(child.maxrss)}")
            raise child.failure()
        log(f"baseline {n:,} records: {child.seconds:.3f} s, client peak rss {mb(child.maxrss)}")
        stock = redis.Redis.from_url(os.environ["STOCK_REDIS_URL"])  # its task results go, as chordflow's phases' do
        keys = list(stock.scan_iter(match="celery-task-meta-*", count=1000))
        for start in range(0, len(keys), 500):
            stock.delete(*keys[start : start + 500])
        stock.close()
        return {**phase.as_dict(), "n": n, "child": child, "phases": phases}

    def local(self, n: int) -> dict[str, Any]:
        """`chordflow run WF --items FILE` (the local backend: one process, the embedded store) then
        `chordflow results RUN --out FILE`; `chordflow run WF --items FILE --out FILE`, one process writing the rows
        as the records run; and the plain PocketFlow loop writing the same file."""
        rows_path = self.bench.workdir / "local-results.jsonl"
        with CpuUse(self.bench.pids, self.bench.cluster.redis.pid) as cpu:
            child = self.bench.cli("run", self.wf, "--items", self.records(n), "--output", "json", limit=LIMIT)
            report = check_job(child, n)
            streamed = self.bench.cli("results", report["run_id"], "--out", str(rows_path), limit=LIMIT)
        if streamed.code != 0 or not check_rows(rows_path, n):
            raise streamed.failure()
        rows_path.unlink()
        one = self.bench.cli("run", self.wf, "--items", self.records(n), "--output", "json", "--out", str(rows_path))
        check_job(one, n)
        if not check_rows(rows_path, n):
            raise one.failure()
        argv = [sys.executable, "-m", "bench.record_flow", self.records(n), str(rows_path)]
        env = {**self.bench.env, "PYTHONPATH": str(harness.HERE.parent)}
        loop = harness.run_child(argv, env, self.bench.workdir, LIMIT)
        if loop.code != 0 or not check_rows(rows_path, n):
            raise loop.failure()
        rows_path.unlink()
        log(
            f"local run of {n:,} records: {child.seconds:.3f} s + results --out {streamed.seconds:.3f} s; "
            f"run --out {one.seconds:.3f} s; plain PocketFlow loop {loop.seconds:.3f} s"
        )
        return {"n": n, "child": child, "results": streamed, "one": one, "loop": loop, "cpu": cpu.text()}


def noop_batch(n: int, rounds: int = 3) -> dict[str, Any]:
    """A local batch of n no-op items (`scheduler.run`, in this process) against a plain PocketFlow loop that
    keeps every item's result (bench/variants.py, the local per-item floor): `rounds` rounds, the two taking turns
    in each; each one's best wall and CPU (the first round, with the first call's imports, given beside as `first`)."""
    from bench import variants

    items = list(range(n))
    bodies = {
        "chordflow": lambda: variants.run_chordflow(items, "local"),
        "loop": lambda: variants.plain_loop(items, {}),
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in bodies}
    for _ in range(rounds):
        for name, body in bodies.items():
            wall, cpu = time.perf_counter(), time.process_time()
            body()
            samples[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    timed: dict[str, Any] = {name: min(runs) for name, runs in samples.items()}
    timed["first"] = {name: runs[0] for name, runs in samples.items()}
    log(f"local no-op batch of {n:,} items: {timed['chordflow'][0]:.3f} s; plain loop {timed['loop'][0]:.3f} s")
    return {"n": n, **timed}
