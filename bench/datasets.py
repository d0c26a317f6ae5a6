"""`python -m bench.datasets`: the scale check of dataset jobs (issue 9, item 6).

A two-node workflow once per record of a JSONL file, through `chordflow submit WF.json --items FILE` and
`chordflow wait RUN`, at 1,000,000 and at 100,000 records (the client's memory must not grow with the file),
on its own cluster (scheduler.localcluster.Cluster: a redis-server on a free port and two solo workers, as
bench/durable.py). For each: wall time, the submitting client's peak RSS (target: < 150 MB at 1,000,000),
the workers' peak RSS, Redis's peak memory and what the job leaves in it, the time to the first readable
result, and `chordflow results RUN --out FILE` streaming every row to a file.

Beside it, in the same run: what a user writes by hand with Celery (read the file, a `group` of tasks over
chunks of 500 records, `GroupResult.get()`), and the local backend (`chordflow run WF --items FILE`).

Writes bench/DATASETS.md (or --out). Progress lines go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import durable
from bench.durable import (
    WORKERS,
    Child,
    RedisPeak,
    chordflow,
    command_line,
    finish,
    forget_run,
    keep_or_remove,
    machine_facts,
    mb,
    redis_text,
    run_child,
    verdict,
    worker_text,
)
from bench.measure import log
from worker.cluster.app import task

HERE = Path(__file__).resolve().parent
POOL = "solo"
PLUGINS = "bench.datasets"  # the workers import this module: it defines the baseline's task
CHUNK = 500  # records per chunk: chordflow's default, and the baseline's chunk
SUBMIT_RSS_MB = 150  # target: the submitting client's peak RSS at the large N
LIMIT = 1800  # seconds: any one child process (a job, the baseline) is killed past this
POLL = 0.005  # seconds between two looks for the first result
RECORDS_TASK = "bench.records_chunk"
TEXT = "some short text"


@dataclass(frozen=True)
class Sizes:
    large: int  # records in the large job
    small: int  # the small one: same measurements, to show the client's memory does not grow
    warm: int  # an untimed job first (the workers' first-chunk costs)


FULL = Sizes(large=1_000_000, small=100_000, warm=2_000)
QUICK = Sizes(large=20_000, small=5_000, warm=500)


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


# -- the hand-written Celery baseline -----------------------------------------------------------------------


def one_record(record: dict[str, Any]) -> dict[str, Any]:
    """The workflow's two steps as plain Python: what a user would call per record."""
    a = {"id": record["id"], "text": record["text"]}
    b = {"n": a["id"]}
    return {"id": b["n"]}


@task(name=RECORDS_TASK)
def records_chunk(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chunk of records through `one_record`, results in the chunk's order."""
    return [one_record(record) for record in records]


def celery_client(path: Path, chunk: int) -> int:
    """The baseline client, run as its own process (`--celery-client FILE`): read the whole file, send a
    `group` of one task per `chunk` records, `GroupResult.get()`, check the results are in input order.
    Prints its phases as one JSON object. A stock Celery app with worker/app.py's config, signing its
    messages as chordflow's do (the workers drop unsigned ones), as bench/variants.py's baselines."""
    from celery import Celery, group

    from worker import settings
    from worker.cluster import app as worker_app
    from worker.cluster import signing

    client = Celery("datasets-bench-client", set_as_current=False)
    client.conf.update(worker_app.config(settings.load()))
    signing.sign_messages(client, worker_app.current_app().signer)
    t0 = time.perf_counter()
    with path.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    read = time.perf_counter()
    job = group(
        (client.signature(RECORDS_TASK, args=(records[i : i + chunk],)) for i in range(0, len(records), chunk)),
        app=client,
    )
    result = job.apply_async()
    sent = time.perf_counter()
    results = [row for part in result.get(timeout=LIMIT) for row in part]
    got = time.perf_counter()
    ordered = len(results) == len(records) and all(row["id"] == i for i, row in enumerate(results))
    print(json.dumps({"read": read - t0, "send": sent - read, "get": got - sent, "n": len(results), "ok": ordered}))
    return 0 if ordered else 1


# -- child processes ------------------------------------------------------------------------------------


def failed(child: Child) -> RuntimeError:
    output = f"{child.stdout[-2000:]}\n{child.stderr[-2000:]}"
    return RuntimeError(f"{shlex.join(child.argv)} exited {child.code}:\n{output}")


def check_job(child: Child, n: int) -> dict[str, Any]:
    """`wait`/`run --output json` of a dataset job: it succeeded with all n records done."""
    try:
        report = json.loads(child.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise failed(child) from None
    if child.code != 0 or report["status"] != "success" or report["outputs"] != {"total": n, "done": n, "failed": 0}:
        raise failed(child)
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


# -- the first readable result ----------------------------------------------------------------------------


class FirstResult:
    """When `chordflow results RUN --done` would first print a line: polls the bench's Redis from submit start
    for the new run id (the `cf:runs` index), then for the first field of its `cf:{run}:ds:out` hash (a
    finished chunk's outcomes, what `--done` prints). Then runs that command once to confirm."""

    def __init__(self, bench: Bench):
        import redis

        self.bench = bench
        self.redis = redis.Redis.from_url(bench.cluster.redis.url)
        self.known = {r.decode() for r in self.redis.zrange("cf:runs", 0, -1)}
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
        self._thread.join()
        self.redis.close()

    def _poll(self) -> None:
        while self.seconds is None and not self._stop.wait(POLL):
            if self.run_id is None:
                new = [r.decode() for r in self.redis.zrange("cf:runs", 0, -1) if r.decode() not in self.known]
                self.run_id = new[0] if new else None
            if self.run_id is not None and self.redis.hlen(f"cf:{{{self.run_id}}}:ds:out"):
                self.seconds = time.perf_counter() - self.t0
        if self.seconds is not None:
            path = self.bench.workdir / "done.jsonl"
            child = self.bench.cli("results", str(self.run_id), "--done", "--out", str(path))
            with path.open("rb") as rows:
                lines = sum(1 for _ in rows)
            self.confirm = {"child": child, "lines": lines, "at": time.perf_counter() - self.t0}


# -- the bench --------------------------------------------------------------------------------------------


@dataclass
class Results:
    sizes: Sizes
    quick: bool
    command: str = ""
    started: float = 0.0
    duration: float = 0.0
    facts: dict[str, str] = field(default_factory=dict)
    floor: Child | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    baseline: list[dict[str, Any]] = field(default_factory=list)
    local: dict[str, Any] = field(default_factory=dict)
    resettable: bool = True
    fingerprint_start: str = ""
    fingerprint_end: str = ""


class Bench(durable.Bench):
    """durable.Bench with workers that import this module (the baseline's task), the two-node workflow, and
    CLI children that do not (a user's `chordflow submit` has no plugin to load); records files of N lines."""

    def __init__(self, workdir: Path):
        super().__init__(workdir, plugins=PLUGINS, doc=workflow(), env={"CHORDFLOW_PLUGINS": ""})

    def start(self) -> None:
        super().start()
        self.check_registered()

    def check_registered(self) -> None:
        from worker.cluster.app import current_app

        registered = current_app().control.inspect(timeout=2.0, limit=len(WORKERS)).registered() or {}
        needed = {RECORDS_TASK, "chordflow.dataset_chunk"}
        missing = {w: needed - set(registered.get(w, ())) for w in registered}
        if len(registered) != len(WORKERS) or any(missing.values()):
            raise RuntimeError(f"workers did not register {sorted(needed)}: {registered}")
        log(f"both workers registered {', '.join(sorted(needed))}")

    def records(self, n: int) -> Path:
        """A JSONL file of n records `{"id": i, "text": ...}` (written once, before any timing)."""
        path = self.workdir / f"records-{n}.jsonl"
        if not path.exists():
            with path.open("w", encoding="utf-8") as f:
                for start in range(0, n, 10_000):
                    f.writelines(f'{{"id": {i}, "text": "{TEXT}"}}\n' for i in range(start, min(n, start + 10_000)))
        return path

    def cli(self, *args: str, limit: float = LIMIT) -> Child:
        return run_child([*chordflow(), *args], self.env, self.workdir, limit)

    def forget(self, run_id: str | None = None) -> None:
        """Delete a run's keys and the Celery task results, so the next phase's memory starts clean."""
        if run_id:
            forget_run(self.redis, run_id)
        metas = list(self.redis.scan_iter(match="celery-task-meta-*", count=1000))
        for start in range(0, len(metas), 500):
            self.redis.delete(*metas[start : start + 500])

    def left(self, run_id: str) -> dict[str, Any]:
        """What a finished job leaves in Redis: used_memory, its own keys (and their MEMORY USAGE), the
        Celery task results."""
        prefix = f"cf:{{{run_id}}}:"
        run_keys = list(self.redis.scan_iter(match=f"{prefix}*", count=1000))
        usage = {k.decode().removeprefix(prefix): self.redis.memory_usage(k, samples=0) or 0 for k in run_keys}
        metas = list(self.redis.scan_iter(match="celery-task-meta-*", count=1000))
        meta_usage = sum(self.redis.memory_usage(k) or 0 for k in metas)
        ttl = self.redis.ttl(f"{prefix}ds:out")
        used = int(self.redis.info("memory")["used_memory"])
        return {"used": used, "usage": usage, "task_results": len(metas), "meta_usage": meta_usage, "ttl": ttl}


def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far (/proc/<pid>/stat)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class CpuUse:
    """CPU used over a phase by the workers, by redis-server, by this process and the children it reaped (the
    CLI processes), and by the whole machine: the difference is other processes' load on the same cores."""

    def __init__(self, bench: Bench):
        self.bench = bench
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        mine = os.times()
        return {
            "workers": process_cpu(self.bench.peaks.pids()),
            "redis": process_cpu([self.bench.cluster.redis.pid]),
            "clients": mine.user + mine.system + mine.children_user + mine.children_system,
            "machine": machine_busy(),
            "wall": time.perf_counter(),
        }

    def __enter__(self) -> CpuUse:
        self.start = self.read()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self.read()
        self.used = {k: end[k] - self.start[k] for k in end}
        self.used["others"] = self.used["machine"] - self.used["workers"] - self.used["redis"] - self.used["clients"]

    def text(self) -> str:
        u = self.used
        return (
            f"{u['machine']:.0f} s busy of {u['wall'] * (os.cpu_count() or 1):.0f} s ({os.cpu_count()} cores x wall): "
            f"workers {u['workers']:.0f} s, redis-server {u['redis']:.0f} s, the CLI processes and this bench "
            f"{u['clients']:.0f} s, **other processes {max(0.0, u['others']):.0f} s**"
        )


def floor(bench: Bench, results: Results) -> None:
    """A 1-record job: the submitting client's RSS floor (interpreter and imports)."""
    path = bench.records(1)
    submit = bench.cli("submit", str(bench.wf_path), "--items", str(path))
    if submit.code != 0:
        raise failed(submit)
    run_id = submit.stdout.strip().splitlines()[-1]
    check_job(bench.cli("wait", run_id, "--output", "json"), 1)
    bench.forget(run_id)
    results.floor = submit
    log(f"submit of 1 record: {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")


def warm_up(bench: Bench, n: int) -> None:
    """An untimed job first: the workers' first-chunk costs (imports, connections) are not in any row."""
    submit = bench.cli("submit", str(bench.wf_path), "--items", str(bench.records(n)))
    if submit.code != 0:
        raise failed(submit)
    run_id = submit.stdout.strip().splitlines()[-1]
    check_job(bench.cli("wait", run_id, "--output", "json"), n)
    bench.forget(run_id)
    log(f"warm-up job of {n:,} records done")


def dataset_job(bench: Bench, n: int, chunk_size: int | None = None) -> dict[str, Any]:
    """`chordflow submit WF --items FILE` then `chordflow wait RUN`, timed from submit start to wait end;
    then `chordflow results RUN --out FILE`."""
    from worker.cluster.state.runs import ClusterRuns

    path = bench.records(n)
    extra = ["--chunk-size", str(chunk_size)] if chunk_size else []
    gc.collect()
    bench.peaks.reset()
    bench.tasks.mark()
    first = FirstResult(bench)
    with RedisPeak(bench.redis) as redis_peak, CpuUse(bench) as cpu:
        wall = time.time()
        started = time.perf_counter()
        first.start(started)
        submit = bench.cli("submit", str(bench.wf_path), "--items", str(path), *extra)
        if submit.code != 0:
            first.stop()
            raise failed(submit)
        run_id = submit.stdout.strip().splitlines()[-1]
        log(f"submit {n:,} records: run {run_id}, {submit.seconds:.3f} s, client peak rss {mb(submit.maxrss)}")
        waited = bench.cli("wait", run_id, "--output", "json")
        seconds = time.perf_counter() - started
    first.stop()
    check_job(waited, n)
    workers = bench.peaks.read()
    left = bench.left(run_id)
    record = ClusterRuns().get(run_id)
    seen = "never" if first.seconds is None else f"{first.seconds:.3f} s"
    log(f"job of {n:,} records: {seconds:.3f} s ({n / seconds:,.0f} records/s); first result {seen}")
    rows_path = bench.workdir / "results.jsonl"
    streamed = bench.cli("results", run_id, "--out", str(rows_path))
    if streamed.code != 0:
        raise failed(streamed)
    ordered = check_rows(rows_path, n)
    size = rows_path.stat().st_size
    rows_path.unlink()
    log(f"results --out {n:,} rows: {streamed.seconds:.3f} s, peak rss {mb(streamed.maxrss)}, in order: {ordered}")
    timeline = bench.tasks.read()
    bench.forget(run_id)
    return {
        "n": n,
        "chunk_size": chunk_size or CHUNK,
        "seconds": seconds,
        "submit": submit,
        "wait": waited,
        "record_final": record.updated - wall if record else None,
        "first": first.seconds,
        "confirm": first.confirm,
        "results": streamed,
        "results_bytes": size,
        "ordered": ordered,
        "workers": workers,
        "worker_cpu": cpu.used["workers"],
        "cpu": cpu.text(),
        "left": left,
        "timeline": timeline,
        "wall": wall,
        **redis_peak.as_dict(),
    }


def baseline(bench: Bench, n: int) -> dict[str, Any]:
    """The hand-written Celery client (`celery_client`) in its own process, over the same file."""
    path = bench.records(n)
    gc.collect()
    bench.peaks.reset()
    argv = [sys.executable, "-m", "bench.datasets", "--celery-client", str(path)]
    with RedisPeak(bench.redis) as redis_peak, CpuUse(bench) as cpu:
        child = run_child(argv, {**bench.env, "PYTHONPATH": str(HERE.parent)}, bench.workdir)
    phases: dict[str, Any] = {}
    with contextlib.suppress(ValueError, IndexError):
        phases = json.loads(child.stdout.strip().splitlines()[-1])
    workers = bench.peaks.read()
    if child.code != 0 or not phases.get("ok"):
        log(f"baseline {n:,} records did not complete: exit {child.code}, peak rss {mb(child.maxrss)}")
        from worker.cluster.app import current_app

        with contextlib.suppress(Exception):
            current_app().control.purge()
    else:
        log(f"baseline {n:,} records: {child.seconds:.3f} s, client peak rss {mb(child.maxrss)}")
    bench.forget()
    return {
        "n": n,
        "child": child,
        "phases": phases,
        "workers": workers,
        "worker_cpu": cpu.used["workers"],
        "cpu": cpu.text(),
        **redis_peak.as_dict(),
    }


def local(bench: Bench, n: int) -> dict[str, Any]:
    """`chordflow run WF --items FILE` (the local backend: this one process, the embedded store)."""
    with CpuUse(bench) as cpu:
        child = bench.cli("run", str(bench.wf_path), "--items", str(bench.records(n)), "--output", "json")
    check_job(child, n)
    log(f"local run of {n:,} records: {child.seconds:.3f} s, peak rss {mb(child.maxrss)}")
    return {"n": n, "child": child, "cpu": cpu.text()}


# -- the report -------------------------------------------------------------------------------------------


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} records/s"


def job_rows(job: dict[str, Any]) -> list[tuple[str, str]]:
    n, submit, waited = job["n"], job["submit"], job["wait"]
    first, confirm, streamed = job["first"], job["confirm"], job["results"]
    left = job["left"]
    timeline = job["timeline"]
    chunks = timeline["tasks"].get("chordflow.dataset_chunk", [0, 0.0])
    biggest = ", ".join(f"{name} {mb(size)}" for name, size in sorted(left["usage"].items(), key=lambda kv: -kv[1])[:3])
    rows = [
        ("wall time, submit start to `wait` end", f"{job['seconds']:.2f} s"),
        ("records/s", rate(n, job["seconds"])),
        (
            "of which `submit` (returns once every record is stored in Redis)",
            f"{submit.seconds:.2f} s ({submit.cpu:.2f} s CPU)",
        ),
        ("of which `wait` (follows the run to its end)", f"{waited.seconds:.2f} s ({waited.cpu:.2f} s CPU)"),
        (
            "run record final (status written by the last chunk), from submit start",
            "?" if job["record_final"] is None else f"{job['record_final']:.2f} s",
        ),
        (
            "worker task time (`chordflow.dataset_chunk`, both workers)",
            f"{chunks[0]:,} chunks, {chunks[1]:.2f} s ({chunks[1] / n * 1e6:.1f} us/record)",
        ),
        (
            "worker CPU (user + system, both workers, the whole phase)",
            f"{job['worker_cpu']:.2f} s ({job['worker_cpu'] / n * 1e6:.1f} us/record)",
        ),
        ("CPU of the machine during the job", job["cpu"]),
        ("**client peak RSS, `chordflow submit`** (GNU time %M)", f"**{mb(submit.maxrss)}**"),
        ("peak RSS, `chordflow wait`", mb(waited.maxrss)),
        ("worker peak RSS (VmHWM)", worker_text(job["workers"])),
        ("Redis peak memory during the job", redis_text(job)),
        (
            "Redis memory left after the job ends",
            f"{mb(left['used'] - job['redis_before'])} above the start ({mb(left['used'])} used). The run's "
            f"{len(left['usage'])} keys hold {mb(sum(left['usage'].values()))} (MEMORY USAGE: {biggest}), "
            f"expiring in {left['ttl'] / 3600:.0f} h; {left['task_results']:,} Celery task results of its "
            f"chunk tasks, {mb(left['meta_usage'])}",
        ),
        (
            "time to the first readable result (first field of `cf:{run}:ds:out`)",
            "never seen" if first is None else f"{first:.2f} s after submit start",
        ),
    ]
    if confirm:
        child = confirm["child"]
        rows.append(
            (
                "confirmed: `chordflow results RUN --done --out F`, started then",
                f"{confirm['lines']:,} lines, exited {confirm['at']:.2f} s after submit start ({child.seconds:.2f} s)",
            )
        )
    rows += [
        (
            "`chordflow results RUN --out FILE` (all rows, after the end)",
            f"{streamed.seconds:.2f} s ({rate(n, streamed.seconds)}), peak RSS {mb(streamed.maxrss)}, "
            f"{mb(job['results_bytes'])} written",
        ),
        ("the file: N lines, line i = record i's row", "yes" if job["ordered"] else "**NO**"),
    ]
    return rows


def jobs_table(jobs: list[dict[str, Any]]) -> str:
    heads = [
        f"{j['n']:,} records" + (f", chunk size {j['chunk_size']}" if j["chunk_size"] != CHUNK else "") for j in jobs
    ]
    lines = ["| measurement | " + " | ".join(heads) + " |", "|---|" + "---|" * len(jobs)]
    columns = [job_rows(j) for j in jobs]
    for i, (label, _) in enumerate(columns[0]):
        lines.append(f"| {label} | " + " | ".join(col[i][1] for col in columns) + " |")
    return "\n".join(lines)


def baseline_table(results: Results) -> str:
    lines = [
        "| variant | records | wall s | records/s | client peak RSS | client CPU s | first result | worker peak RSS "
        "| worker CPU s | Redis peak |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|---|",
    ]
    for job in results.jobs:
        if job["chunk_size"] == CHUNK:
            first = "-" if job["first"] is None else f"{job['first']:.2f} s"
            lines.append(
                f"| chordflow `submit` + `wait` | {job['n']:,} | {job['seconds']:.2f} "
                f"| {rate(job['n'], job['seconds'])} | {mb(job['submit'].maxrss)} "
                f"| {job['submit'].cpu + job['wait'].cpu:.2f} | {first} | {mb(max(job['workers'].values()))} "
                f"| {job['worker_cpu']:.2f} | {redis_text(job).split(' (')[0]} |"
            )
    for run in results.baseline:
        child, phases = run["child"], run["phases"]
        done = child.code == 0 and phases.get("ok")
        what = (
            f"{child.seconds:.2f} | {rate(run['n'], child.seconds)}"
            if done
            else f"did not complete (exit {child.code}) after {child.seconds:.2f} | -"
        )
        lines.append(
            f"| hand-written Celery `group` + `GroupResult.get()` | {run['n']:,} | {what} | {mb(child.maxrss)} "
            f"| {child.cpu:.2f} | {'at the end' if done else '-'} | {mb(max(run['workers'].values()))} "
            f"| {run['worker_cpu']:.2f} | {redis_text(run).split(' (')[0]} |"
        )
    if results.local:
        child = results.local["child"]
        n = results.local["n"]
        lines.append(
            f"| chordflow local, `run --items` | {n:,} | {child.seconds:.2f} | {rate(n, child.seconds)} "
            f"| {mb(child.maxrss)} (the only process) | {child.cpu:.2f} | - | - | - | - |"
        )
    return "\n".join(lines)


def baseline_phases(results: Results) -> str:
    parts = []
    for run in results.baseline:
        p = run["phases"]
        if p:
            parts.append(
                f"- {run['n']:,} records: reading and decoding the file {p['read']:.2f} s, building and sending the "
                f"group ({-(-run['n'] // CHUNK):,} tasks) {p['send']:.2f} s, `GroupResult.get()` {p['get']:.2f} s; "
                f"the rest of the wall time is the interpreter and imports. Results in input order: {p['ok']}. "
                f"CPU of the machine: {run['cpu']}."
            )
    if results.local:
        parts.append(f"- Local, {results.local['n']:,} records: CPU of the machine: {results.local['cpu']}.")
    return "\n".join(parts)


def notes(results: Results) -> list[str]:
    out = []
    jobs = {j["n"]: j for j in results.jobs if j["chunk_size"] == CHUNK}
    large, small = jobs.get(results.sizes.large), jobs.get(results.sizes.small)
    if large and small:
        growth = large["submit"].maxrss - small["submit"].maxrss
        out.append(
            f"- The client's memory does not grow with the file: `chordflow submit` peaks at "
            f"{mb(large['submit'].maxrss)} for {large['n']:,} records and {mb(small['submit'].maxrss)} for "
            f"{small['n']:,} ({growth / 2**20:+.1f} MB for {large['n'] // small['n']}x the records)"
            + (f"; a 1-record job peaks at {mb(results.floor.maxrss)}." if results.floor else ".")
        )
        out.append(
            f"- Redis does grow with the file: the job's peak is {mb(large['redis_sampled'] - large['redis_before'])} "
            f"above the start at {large['n']:,} records, {mb(small['redis_sampled'] - small['redis_before'])} at "
            f"{small['n']:,} (sampled maxima). `submit` stores every chunk of records as it reads them, and "
            "each chunk's outcomes stay until the run expires."
        )
    baselines = {b["n"]: b for b in results.baseline if b["child"].code == 0 and b["phases"].get("ok")}
    if large and large["n"] in baselines:
        raw = baselines[large["n"]]
        out.append(
            f"- Where the time goes at {large['n']:,} records: the workers. chordflow's use "
            f"{large['worker_cpu'] / large['n'] * 1e6:.0f} us of CPU per record (both workers together, "
            f"{large['worker_cpu']:.0f} s over a {large['seconds']:.0f} s job on 2 cores), the baseline's "
            f"{raw['worker_cpu'] / raw['n'] * 1e6:.0f} us: a record of this workflow is a workflow instance "
            "(inputs applied and checked, two nodes stepped with their templates resolved, outputs built), the "
            "baseline's a plain function call. The baseline's wall time is its client's: building and sending "
            f"the group takes {raw['phases']['send']:.0f} of its {raw['child'].seconds:.0f} s "
            f"({raw['child'].cpu:.0f} s of client CPU), the workers keeping up; and the client holds every record "
            f"and every result: {mb(raw['child'].maxrss)} against {mb(large['submit'].maxrss)} for `chordflow submit`."
        )
    if not results.resettable:
        out.append("- Worker VmHWM could not be reset between phases: the worker columns are lifetime peaks.")
    if results.fingerprint_end != results.fingerprint_start:
        out.append("- **chordflow's sources changed while the bench ran**: the numbers mix two versions.")
    return out


def report(results: Results) -> str:
    sizes = results.sizes
    large = next((j for j in results.jobs if j["n"] == sizes.large and j["chunk_size"] == CHUNK), None)
    target = (
        f"`chordflow submit` of {sizes.large:,} records peaks at {mb(large['submit'].maxrss)}: "
        f"target < {SUBMIT_RSS_MB} MB: {verdict(large['submit'].maxrss < SUBMIT_RSS_MB * 2**20)}"
        if large
        else "the large job did not run: **FAIL**"
    )
    facts = "\n".join(f"| {k} | {v} |" for k, v in results.facts.items())
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(results.started))
    wf = json.dumps(workflow()["nodes"])
    return f"""# Dataset jobs at scale: a workflow once per record of a 1,000,000-line file

`python -m bench.datasets{" --quick" if results.quick else ""}` ({when}, {results.duration:.0f} s in all).
Sources: {results.fingerprint_start}.

{target}.

## `chordflow submit WF.json --items FILE` + `chordflow wait RUN`

{jobs_table(results.jobs)}

## Against a hand-written Celery client, and the local backend

{baseline_table(results)}

{baseline_phases(results)}

{chr(10).join(notes(results))}

## Method

- One `scheduler.localcluster.Cluster`: its own `redis-server` on a free port and two solo workers
  (`celery -A worker.app worker -P {POOL} -c 1`, as `python -m bench`), started with
  `CHORDFLOW_PLUGINS={PLUGINS}` (the baseline's task) and stopped in a `finally`. The `chordflow` commands
  run without it.
- The workflow: two built-in `echo` nodes per record, `{wf}`, outputs `{{"id": "${{b.n}}"}}`, records
  `{{"id": i, "text": "{TEXT}"}}` one per line (written before any timing). Default chunk size ({CHUNK}).
  An untimed job of {sizes.warm:,} records runs first (the workers' first-chunk costs).
- Every `chordflow` command is a fresh subprocess (`{shlex.join(chordflow())}`); its wall time includes
  the interpreter start and imports; its peak RSS is GNU time's `%M` (the whole process). `wait --output
  json` is checked: status success, `total` = `done` = N, `failed` = 0. Wall time runs from submit start to
  `wait`'s exit (`wait` polls; the run record's final update is given beside it).
- Client CPU: user + system of the client processes (for chordflow, `submit` + `wait`); worker CPU:
  user + system of both worker processes over the phase, from `/proc/<pid>/stat`. The machine is shared
  with other sessions: "CPU of the machine" is its busy time over the phase (`/proc/stat`) beside what the
  bench's own processes used (workers, redis-server, the CLI processes and this one, reaped children
  included); the rest is other processes' load on the same 2 cores, which slows every phase it lands in.
- Worker peak RSS: VmHWM of both worker processes, reset through `/proc/<pid>/clear_refs` before each
  phase. Redis: `INFO memory` used_memory sampled every 10 ms from submit start to `wait`'s end, and
  used_memory_peak when the phase raised it; "left" is used_memory once `wait` returned, with the run's
  own keys (`cf:{{run}}:*`, `MEMORY USAGE ... SAMPLES 0`). Each phase's keys and the Celery task results
  are deleted before the next phase.
- First readable result: a thread polls Redis every {POLL * 1000:.0f} ms from submit start, for the new
  run id in `cf:runs` and then the first field of `cf:{{run}}:ds:out` (a finished chunk's outcomes: what
  `results --done` prints); when it appears, `chordflow results RUN --done --out F` runs once to confirm
  that it prints lines (its own start-up is the gap between the two rows). That command runs during the
  job, on the same 2 cores.
- Results: `chordflow results RUN --out FILE` after the job ended, timed as a fresh process; the file is
  then read line by line: line i must be `{{"index": i, "result": {{"id": i}}, "error": null}}`.
- The baseline (`python -m bench.datasets --celery-client FILE`, a fresh process, GNU time %M): what a
  user writes by hand. It reads the whole file into a list (`json.loads` per line), sends a Celery
  `group` of one `{RECORDS_TASK}` task per {CHUNK} records (each calls a plain function doing the two
  steps per record: `a = {{id, text}}`, `b = {{n: a.id}}`, returns `{{id: b.n}}`), then
  `GroupResult.get()` and checks the results are in input order. A stock `Celery` app with worker/app.py's
  config (msgpack, acks_late, prefetch 1, Celery's own RedisBackend), signing its messages as the workers
  require (bench/variants.py does the same).
- Local: `chordflow run WF --items FILE --output json`, one process (the records run in it as it reads
  them), its embedded store in a temp `CHORDFLOW_HOME`.

## Machine

| fact | value |
|---|---|
{facts}

Command: `{results.command}`
"""


# -- main -------------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.datasets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"small sizes: {QUICK}")
    parser.add_argument("--out", type=Path, default=HERE, help="where DATASETS.md goes (default: bench/)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the redis/worker logs directory")
    parser.add_argument(
        "--chunk-size", type=int, action="append", default=[], metavar="N",
        help="also a job of the small size with this --chunk-size (repeatable)",
    )  # fmt: skip
    parser.add_argument("--celery-client", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from bench.run import fingerprint

    args = parse_args(argv)
    if args.celery_client:
        return celery_client(args.celery_client, CHUNK)
    sizes = QUICK if args.quick else FULL
    results = Results(sizes, args.quick, started=time.time())
    results.command = command_line("bench.datasets")
    results.fingerprint_start = fingerprint()
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="chordflow-datasets-"))
    bench = Bench(workdir)
    try:
        bench.start()
        results.facts = machine_facts(bench)
        for n in (sizes.large, sizes.small):
            bench.records(n)
        log(f"records files written: {sizes.large:,} and {sizes.small:,} lines")
        floor(bench, results)
        warm_up(bench, sizes.warm)
        results.jobs.append(dataset_job(bench, sizes.large))
        results.jobs.append(dataset_job(bench, sizes.small))
        for size in args.chunk_size:
            results.jobs.append(dataset_job(bench, sizes.small, size))
        results.baseline.append(baseline(bench, sizes.small))
        results.baseline.append(baseline(bench, sizes.large))
        results.local = local(bench, sizes.small)
        results.resettable = bench.peaks.resettable
    finally:
        bench.stop()
        if not results.facts:
            results.facts = machine_facts(None)
    finish(results, report, args.out / "DATASETS.md", t0)
    keep_or_remove(workdir, args.keep_logs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
