"""`python -m bench.io`: I/O-bound batch items against a loopback, rate-limited API, every variant in one run.

The API (bench/io_server.py, its own process): answers a GET after 50 ms, allows 200 requests a second over
the whole server (a token bucket banking at most 10) and answers 429 with `Retry-After: 1` above that; it counts
requests, 200s, 429s and TCP connections, reset before each variant. The ideal time is items / 200.

On the bench's own redis-server (bench/harness.py), each variant with workers of its own:

a. chordflow, as a user runs it: 2 x `chordflow worker` with its defaults, one `http` batch node
   (`parallel`, `max_concurrent` 64) declaring `rate_limit` {key bench-api, 200/s}; `chordflow submit` +
   `chordflow wait`.
d. on the same workers, two such runs at once naming the same key, half the items each.
b. chordflow without a declared limit on 2 x `chordflow worker -P threads -c 32`: every item must still
   succeed (the http node waits out its 429s).
c. what a user writes by hand (bench/io_tasks.py): a Celery app of its own, one `httpx.get` task per item, a
   `group` of them, `GroupResult.get()`, 2 x `celery worker -P threads -c 32`.

Connections are counted by the server; which worker process opened each is read off /proc/net/tcp and the
workers' file descriptors every 50 ms while a variant runs. Writes bench/IO.md (or --out).

Internal modules it uses beyond the public API: `scheduler.localcluster`, `worker.cluster.app`,
`worker.cluster.state.heartbeat`.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import BenchCluster, Child, Session, log
from bench.measure import process_tree
from scheduler.localcluster import ManagedProcess, free_port

RATE = 200.0  # requests a second, the server's limit and the declared one
BURST = 10  # requests the server's bucket banks
LATENCY = 0.05  # seconds per answered request
RETRY_AFTER = "1"
KEY = "bench-api"
MAX_CONCURRENT = 64
THREADS = 32  # -c of the threaded workers (b, c)
NODE = "fetch"
SUCCEEDED = "succeeded"  # a run's final status when it succeeded (worker/runs/record.py)
TICK = 0.05  # seconds between two looks at who owns the connections
STOP_WAIT = 15.0  # seconds a stopped worker has to leave the registry


@dataclass(frozen=True)
class Sizes:
    items: int
    warm: int  # an untimed run on each set of workers first


FULL = Sizes(items=3_000, warm=64)
QUICK = Sizes(items=300, warm=32)
TARGET_RATIO, TARGET_429, TARGET_CONNECTIONS = 1.3, 3.0, 10


def limit_for(items: int) -> float:
    """Seconds any one variant may take before it is cut off (recorded as timed out)."""
    return max(60.0, 12 * items / RATE)


# -- the API server -------------------------------------------------------------------------------------------
class ApiServer:
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "bench.io_server", "--port", str(self.port), "--rate", f"{RATE:g}"]
        argv += ["--burst", str(BURST), "--latency", f"{LATENCY:g}", "--retry-after", RETRY_AFTER]
        self.process = ManagedProcess(argv, workdir / "io-server.log", "io_server ready")
        log(f"API server on {self.base} (pid {self.process.pid})")

    def call(self, method: str, path: str) -> dict[str, Any]:
        request = urllib.request.Request(self.base + path, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def reset(self) -> None:
        self.call("POST", "/reset")

    def stats(self) -> dict[str, Any]:
        return self.call("GET", "/stats")

    def stop(self) -> None:
        self.process.kill(signal.SIGTERM)


# -- who opened each connection ---------------------------------------------------------------------------------
class SocketOwners:
    """Every TICK seconds (at most `limit` seconds): the established client sockets to the API in /proc/net/tcp,
    and for the ones not seen yet, which of `pids` holds them (a scan of those processes' fds)."""

    def __init__(self, port: int, pids: list[int], limit: float):
        self.port, self.pids, self.limit = port, pids, limit
        self.owner: dict[int, int] = {}  # client port -> pid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-owners", daemon=True)

    def __enter__(self) -> SocketOwners:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self._look()  # the connections still open at the end

    def _run(self) -> None:
        deadline = time.monotonic() + self.limit
        while not self._stop.wait(TICK) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self._look()

    def _look(self) -> None:
        unseen: dict[int, int] = {}
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != "01" or int(parts[2].rsplit(":", 1)[1], 16) != self.port:
                continue
            local = int(parts[1].rsplit(":", 1)[1], 16)
            if local not in self.owner and parts[9] != "0":
                unseen[local] = int(parts[9])
        if not unseen:
            return
        holders = {}
        for pid in self.pids:
            with contextlib.suppress(OSError):
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    with contextlib.suppress(OSError):
                        target = fd.readlink().name
                        if target.startswith("socket:["):
                            holders[int(target[8:-1])] = pid
        for local, inode in unseen.items():
            if inode in holders:
                self.owner[local] = holders[inode]

    def per_process(self, ports: list[int]) -> tuple[dict[int, int], int]:
        """Connections by pid (every pid of `pids`, 0 for none) and how many could not be attributed."""
        counts = Counter(self.owner.get(port) for port in ports)
        unknown = counts.pop(None, 0)
        return {pid: counts.get(pid, 0) for pid in self.pids}, unknown


# -- the workers of a variant -------------------------------------------------------------------------------------
def chordflow_worker(name: str, *options: str) -> list[str]:
    """`chordflow worker` as a user starts it (plus a node name and the harness's quiet start)."""
    return [*harness.chordflow(), "worker", *options, "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]


def celery_worker(name: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "bench.io_tasks", "worker", "-P", "threads", "-c", str(THREADS)]
    return [*argv, "-Q", "io-bench", "-l", "info", "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]


@dataclass
class Workers:
    """Worker processes started for one set of variants, stopped (SIGTERM, a warm shutdown) at the end."""

    bench: BenchCluster
    argvs: dict[str, list[str]]
    chordflow: bool = True
    mains: dict[str, int] = field(default_factory=dict)
    executing: list[int] = field(default_factory=list)  # the processes that run tasks: pool children, else mains
    pool: str = ""

    def __enter__(self) -> Workers:
        cluster = self.bench.cluster
        try:
            for name, argv in self.argvs.items():
                log(f"worker {name}: {shlex.join(argv)}")
                worker = ManagedProcess(argv, cluster.workdir / f"worker-{name}.log", "ready.", env=self.bench.env)
                cluster.workers[name] = worker
                self.mains[name] = worker.pid
            for pid in self.mains.values():
                children = process_tree(pid)[1:]
                self.executing += children or [pid]
            self.pool = self.describe()
            if self.chordflow:
                self.registered(lambda names: names >= set(self.argvs), "to register")
        except BaseException:
            self.__exit__()
            raise
        log(f"workers ready: {self.pool}; {len(self.executing)} processes run tasks")
        return self

    def describe(self) -> str:
        """Pool and concurrency as the workers report them (`inspect stats`)."""
        if self.chordflow:
            from worker.cluster.app import current_app

            app = current_app()
        else:
            from bench.io_tasks import app
        stats: dict[str, Any] = {}
        for _ in range(3):  # a loaded machine may miss the 2 s reply window: ask the silent ones again
            missing = [f"{name}@" for name in self.argvs if not any(k.startswith(f"{name}@") for k in stats)]
            if not missing:
                break
            stats.update(app.control.inspect(timeout=2.0, limit=len(missing)).stats() or {})
        pools = sorted(
            f"{name.split('@')[0]}: {s['pool'].get('implementation', '?').split(':')[0].rsplit('.', 1)[-1]} "
            f"x {s['pool'].get('max-concurrency', '?')}"
            for name, s in stats.items()
            if "pool" in s and name.split("@")[0] in self.argvs
        )
        silent = [name for name in self.argvs if not any(k.startswith(f"{name}@") for k in stats)]
        return ", ".join(pools + [f"{name}: no stats reply" for name in silent])

    def registered(self, ok: Callable[[set[str]], bool], what: str) -> None:
        """Wait (at most STOP_WAIT s) until the worker registry's hostnames satisfy `ok`."""
        from worker.cluster.state.heartbeat import pool_sizes

        deadline = time.monotonic() + STOP_WAIT
        while True:
            names = {host.split("@", 1)[0] for host in pool_sizes(self.bench.redis)}
            if ok(names):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers {sorted(self.argvs)} did not {what} in the registry: {sorted(names)}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        for name in self.argvs:
            worker = self.bench.cluster.workers.pop(name, None)
            if worker is not None:
                worker.kill(signal.SIGTERM)
        if self.chordflow:
            with contextlib.suppress(Exception):
                self.registered(lambda names: not names & set(self.argvs), "leave")
        log(f"workers {', '.join(self.argvs)} stopped")


# -- one measured variant -------------------------------------------------------------------------------------
@dataclass
class Row:
    variant: str
    what: str
    items: int
    wall: float = 0.0
    failed: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    processes: int = 0
    by_process: dict[int, int] = field(default_factory=dict)
    unattributed: int = 0
    workers: str = ""
    note: str = ""
    error: str | None = None  # the bench could not measure it (a process failed, a timeout)
    ended: str = ""  # how a run that did not succeed ended: its status and error (its items count as failed)

    @property
    def ideal(self) -> float:
        return self.items / RATE

    @property
    def requests(self) -> int:
        return int(self.stats.get("requests", 0))

    @property
    def throttled_percent(self) -> float:
        return 100.0 * self.stats.get("throttled", 0) / self.requests if self.requests else 0.0

    @property
    def connections(self) -> int:
        return int(self.stats.get("connections", 0))

    @property
    def per_process_mean(self) -> float:
        return self.connections / self.processes if self.processes else 0.0

    @property
    def per_process_max(self) -> int:
        return max(self.by_process.values(), default=0)


@dataclass
class Results:
    sizes: Sizes
    base: str = ""
    rows: list[Row] = field(default_factory=list)


class Variants:
    def __init__(self, bench: BenchCluster, server: ApiServer, sizes: Sizes):
        self.bench, self.server, self.sizes = bench, server, sizes
        self.limited = str(bench.write("wf-limited.json", json.dumps(workflow(rate_limit=True))))
        self.unlimited = str(bench.write("wf-unlimited.json", json.dumps(workflow(rate_limit=False))))

    def inputs(self, start: int, stop: int) -> str:
        body = {"items": list(range(start, stop)), "base": self.server.base}
        return str(self.bench.write(f"inputs-{start}-{stop}.json", json.dumps(body)))

    @contextlib.contextmanager
    def measured(self, row: Row, workers: Workers) -> Iterator[Row]:
        """Fresh counters, the sockets' owners followed, the wall time; the row filled in afterwards. An
        exception inside is recorded in the row (the other variants still run)."""
        row.workers, row.processes = workers.pool, len(workers.executing)
        self.server.reset()
        try:
            with SocketOwners(self.server.port, workers.executing, limit_for(row.items) + 120) as owners:
                t0 = time.perf_counter()
                try:
                    yield row
                finally:
                    row.wall = time.perf_counter() - t0
        except Exception as exc:  # the report says what went wrong; the other variants still run
            row.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            log(f"({row.variant}) failed: {row.error}")
        row.stats = self.server.stats()
        row.by_process, row.unattributed = owners.per_process(row.stats.get("ports", []))

    @staticmethod
    def done(row: Row) -> Row:
        log(
            f"({row.variant}) {row.items} items: {row.wall:.2f} s (ideal {row.ideal:.2f} s), {row.requests} requests, "
            f"{row.throttled_percent:.1f}% 429, {row.failed} failed, {row.connections} connections"
        )
        return row

    # -- chordflow ------------------------------------------------------------------------------------------------
    def chordflow_run(self, wf: str, inputs: str, limit: float) -> tuple[str, Child, Child]:
        """`chordflow submit` then `chordflow wait`: the run id and both processes."""
        submit = self.bench.cli("submit", wf, "--inputs-file", inputs, limit=120)
        run_id = submit.last_line()
        waited = self.bench.cli("wait", run_id, "--timeout", f"{limit:.0f}", limit=limit + 60)
        return run_id, submit, waited

    def outcome(self, run_id: str, waited: Child, n: int) -> tuple[int, str, str]:
        """(failed items, a note, how it ended unless it succeeded) of a finished run. A run that did not
        succeed delivers no batch result: its items without a recorded success count as failed."""
        status = self.bench.cli("status", run_id, "--json")
        if status.code != 0:
            raise status.failure()
        info = json.loads(status.stdout)
        counts = info.get("batches", {}).get(NODE, {"done": 0, "failed": 0})
        succeeded = int(counts.get("done", 0)) - int(counts.get("failed", 0))
        ok = info.get("status") == SUCCEEDED
        failed = n - succeeded if ok else n
        ended = "" if ok else f"{info.get('status')}: {info.get('error')}"
        if waited.code == 124:  # `wait --timeout` passed: cut off, its items count as failed
            ended = f"{info.get('status')} when `wait --timeout` passed; cancelled"
        note = "" if waited.code == 0 else f"wait exited {waited.code}"
        if waited.code == 124:
            self.bench.cli("cancel", run_id)
            self.bench.purge()
        if counts.get("failed"):
            note = "; ".join(filter(None, [note, self.errors(run_id)]))
        self.bench.forget(run_id)
        return failed, note, ended

    def errors(self, run_id: str) -> str:
        """The failed items' errors, by type, with one message."""
        path = self.bench.workdir / f"errors-{run_id}.jsonl"
        child = self.bench.cli("results", run_id, "--node", NODE, "--errors", "--format", "jsonl", "--out", str(path))
        if child.code != 0 or not path.exists():
            return ""
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        kinds = Counter(str(r.get("exception_type") or r.get("error", "?"))[:60] for r in rows)
        first = next((str(r.get("error", "")) for r in rows if r.get("error")), "")
        return "errors: " + ", ".join(f"{k} x {v}" for k, v in kinds.most_common(3)) + (f" (e.g. `{first[:150]}`)")

    def warm(self, wf: str) -> None:
        run_id, _, waited = self.chordflow_run(wf, self.inputs(0, self.sizes.warm), 120)
        if waited.code != 0:
            raise waited.failure()
        self.bench.forget(run_id)
        time.sleep(1.0)  # the bucket and the server settle

    def chordflow_variant(self, variant: str, what: str, wf: str, workers: Workers) -> Row:
        n = self.sizes.items
        row = Row(variant, what, n)
        with self.measured(row, workers):
            run_id, submit, waited = self.chordflow_run(wf, self.inputs(0, n), limit_for(n))
        if row.error is None:
            row.failed, note, row.ended = self.outcome(run_id, waited, n)
            row.note = "; ".join(filter(None, [f"submit {submit.seconds:.2f} s, wait {waited.seconds:.2f} s", note]))
        else:
            row.failed = n
        return self.done(row)

    def two_runs(self, workers: Workers) -> Row:
        """(d): two runs submitted at once, half the items each, both declaring the same key."""
        n, half = self.sizes.items, self.sizes.items // 2
        row = Row("d", "chordflow, two runs at once sharing the key", n)
        halves = [self.inputs(0, half), self.inputs(half, n)]
        runs: list[tuple[str, Child, Child]] = []
        with self.measured(row, workers), ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(self.chordflow_run, self.limited, inputs, limit_for(n)) for inputs in halves]
            runs = [future.result() for future in futures]
        if row.error is None:
            sizes = (half, n - half)
            outcomes = [self.outcome(run_id, waited, m) for (run_id, _, waited), m in zip(runs, sizes, strict=True)]
            row.failed = sum(failed for failed, _, _ in outcomes)
            row.ended = "; ".join(filter(None, (ended for _, _, ended in outcomes)))
            walls = ", ".join(f"{submit.seconds + waited.seconds:.2f}" for _, submit, waited in runs)
            row.note = "; ".join(filter(None, [f"submit + wait: {walls} s", *(note for _, note, _ in outcomes)]))
        else:
            row.failed = n
        return self.done(row)

    # -- the hand-written Celery baseline ------------------------------------------------------------------------
    def celery_client(self, n: int) -> Child:
        argv = [sys.executable, "-m", "bench.io_tasks", "--base", self.server.base, "--items", str(n)]
        argv += ["--timeout", f"{limit_for(n):.0f}"]
        return harness.run_child(argv, self.bench.env, self.bench.workdir, limit_for(n) + 60)

    def celery_variant(self, workers: Workers) -> Row:
        n = self.sizes.items
        warm = self.celery_client(self.sizes.warm)
        if warm.code != 0:
            raise warm.failure()
        time.sleep(1.0)
        row = Row("c", "hand-written Celery group, one httpx.get per task", n)
        with self.measured(row, workers):
            child = self.celery_client(n)
            report = json.loads(child.last_line())
        self.bench.forget(None, task_results=True)
        if row.error is not None:
            row.failed = n
            return self.done(row)
        statuses, raised = report["statuses"], report["raised"]
        row.failed = n - int(statuses.get("200", 0))
        seen = ", ".join(f"HTTP {k} x {v}" for k, v in sorted(statuses.items()))
        row.note = seen + "".join(f", raised {k} x {v}" for k, v in raised.items())
        row.note += f"; group sent in {report['send']:.2f} s, get {report['get']:.2f} s"
        return self.done(row)


def workflow(*, rate_limit: bool) -> dict[str, Any]:
    """One http batch node over `items`, GET `${base}/item/${item}`, continuing past failed items."""
    node: dict[str, Any] = {
        "id": NODE,
        "type": "http",
        "params": {"url": "${base}/item/${item}", "timeout": 30},
        "batch": {
            "items": "${items}",
            "parallel": True,
            "max_concurrent": MAX_CONCURRENT,
            "error_handling": "continue",
        },
    }
    if rate_limit:
        node["rate_limit"] = {"key": KEY, "requests_per_second": RATE}
    inputs = {"items": {"description": "item ids", "required": True}, "base": {"description": "the API's base URL"}}
    return {"ir_version": "0.1.0", "name": "io_bench", "inputs": inputs, "nodes": [node]}


def measure(session: Session, bench: BenchCluster) -> Results:
    sizes = QUICK if session.quick else FULL
    server = ApiServer(bench.workdir)
    results = Results(sizes, server.base)
    session.facts["API server"] = (
        f"`python -m bench.io_server` on {server.base}: {RATE:g} requests/s (token bucket, burst {BURST}), "
        f"{LATENCY * 1000:g} ms per 200, 429 with Retry-After: {RETRY_AFTER}"
    )
    only = set(session.args.only)
    try:
        variants = Variants(bench, server, sizes)
        if only & set("ad"):
            with Workers(bench, {"a1": chordflow_worker("a1"), "a2": chordflow_worker("a2")}) as workers:
                session.facts["workers (a, d)"] = f"2 x `chordflow worker` (defaults): {workers.pool}"
                variants.warm(variants.limited)
                if "a" in only:
                    what = f"chordflow, rate_limit {RATE:g}/s, default workers"
                    results.rows.append(variants.chordflow_variant("a", what, variants.limited, workers))
                if "d" in only:
                    results.rows.append(variants.two_runs(workers))
        threaded = ("-P", "threads", "-c", str(THREADS))
        if "b" in only:
            names = {"b1": chordflow_worker("b1", *threaded), "b2": chordflow_worker("b2", *threaded)}
            with Workers(bench, names) as workers:
                session.facts["workers (b)"] = f"2 x `chordflow worker -P threads -c {THREADS}`: {workers.pool}"
                variants.warm(variants.unlimited)
                what = f"chordflow, no declared limit, -P threads -c {THREADS}"
                results.rows.append(variants.chordflow_variant("b", what, variants.unlimited, workers))
        if "c" in only:
            names = {"c1": celery_worker("c1"), "c2": celery_worker("c2")}
            with Workers(bench, names, chordflow=False) as workers:
                session.facts["workers (c)"] = (
                    f"2 x `celery -A bench.io_tasks worker -P threads -c {THREADS}`: {workers.pool}"
                )
                results.rows.append(variants.celery_variant(workers))
    finally:
        server.stop()
    results.rows.sort(key=lambda row: row.variant)
    return results
