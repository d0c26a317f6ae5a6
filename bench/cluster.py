"""The bench's own cluster: one redis-server on a free port and two solo Celery workers.

Never the machine's shared Redis: scheduler.localcluster.Cluster starts a private redis-server, and
`apply_env()` points this (scheduler) process at it before the Celery app is (re)configured. The cluster's
env holds a random signing key: chordflow's app and the raw-Celery client both sign with it, as the workers
verify every task message (worker/cluster/signing.py) - the baselines pay the same signature as chordflow.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench import raw_tasks, variants
from bench.measure import WorkerLogs, log
from scheduler.localcluster import Cluster
from worker.cluster import signing

PLUGINS = "bench.raw_tasks"
WORKERS = ("w1", "w2")  # two solo workers = 2 worker processes (the same for every Celery variant)
POOL = "solo"
CONCURRENCY = 1
CHORDFLOW_TASKS = ("chordflow.run_chunk", "chordflow.aggregate")


@dataclass
class BenchCluster:
    cluster: Cluster
    app: Any
    redis: redis.Redis
    logs: WorkerLogs
    processes: int
    client: Any = None  # stock Celery app with worker/app.py's config: dispatches the raw baselines
    get_check: str = ""
    registered: dict[str, list[str]] = field(default_factory=dict)
    worker_stats: dict[str, Any] = field(default_factory=dict)
    previous_env: dict[str, str | None] = field(default_factory=dict)

    def stop(self) -> None:
        if self.client is not None:  # results unsubscribe when released: let them, while Redis is still up
            variants.settle(self.client)
        gc.collect()
        for app in (self.client, self.app):
            with contextlib.suppress(Exception):  # no result consumer was ever started, or it is closed
                app.backend.result_consumer.stop()
        self.cluster.stop()
        self.cluster.restore_env(self.previous_env)
        log("cluster stopped (redis-server and both workers)")


def start(workdir: Path) -> BenchCluster:
    """Start redis + workers, point this process at them, and check the workers know the bench tasks."""
    cluster = Cluster(workdir, plugins=PLUGINS)
    log(f"redis-server on {cluster.redis.url} (pid {cluster.redis.pid}); logs in {workdir}")
    try:
        for name in WORKERS:
            worker = cluster.start_worker(name, pool=POOL, concurrency=CONCURRENCY)
            log(f"worker {name}: -P {POOL} -c {CONCURRENCY} (pid {worker.pid}) ready")
        previous = cluster.apply_env()
        from worker.cluster.app import current_app

        app = current_app()
        if app.conf.broker_url != cluster.redis.url:
            raise RuntimeError(f"the Celery app points at {app.conf.broker_url}, not the bench's {cluster.redis.url}")
        inspect = app.control.inspect(timeout=2.0, limit=len(WORKERS))
        registered = {k: sorted(v) for k, v in (inspect.registered() or {}).items()}
        stats = app.control.inspect(timeout=2.0, limit=len(WORKERS)).stats() or {}
        problems = []
        for name in WORKERS:
            worker_key = next((k for k in registered if k.startswith(f"{name}@")), None)
            missing = set(raw_tasks.TASK_NAMES + CHORDFLOW_TASKS) - set(registered.get(worker_key, []))
            if worker_key is None or missing:
                problems.append(f"{name}: missing {sorted(missing) if worker_key else 'no reply'}")
        if problems:
            raise RuntimeError("workers did not register the bench tasks: " + "; ".join(problems))
        processes = sum(int(s.get("pool", {}).get("max-concurrency", 1)) for s in stats.values())
        log(f"workers registered {', '.join(raw_tasks.TASK_NAMES)}; {processes} worker processes in total")
        logs = WorkerLogs([w.log for w in cluster.workers.values()])
        client = redis.Redis.from_url(cluster.redis.url)
        stock = signing.sign_messages(variants.stock_client(), app.signer)  # the workers drop unsigned tasks
        bench = BenchCluster(cluster, app, client, logs, processes, stock, "", registered, stats)
        bench.previous_env = previous
        bench.get_check = check_get(app)
        log(f"AsyncResult.get() on chordflow's own app: {bench.get_check}")
        return bench
    except BaseException:
        cluster.stop()
        raise


def check_get(app: Any, delay: float = 0.5, timeout: float = 3.0) -> str:
    """Does `AsyncResult.get()` work on chordflow's app, for a task that is not one of chordflow's chords?

    It did not when this bench was written: RunResultBackend skipped every result subscription, so such
    a `.get()` waited until its timeout. Found here and fixed (subscriptions are skipped only inside
    `backend.quiet()`; tests/test_distributed.py::test_other_tasks_on_the_app_can_still_wait_for_their_results).
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


def machine_facts(bench: BenchCluster | None) -> dict[str, str]:
    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        nproc = str(len(os.sched_getaffinity(0)))
    facts = {
        "nproc": nproc,
        "cpu": cpu or platform.processor() or "unknown",
        "os": platform.platform(),
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "redis (redis-py)": version("redis"),
        "msgpack": version("msgpack"),
        "pocketflow": version("pocketflow"),
        "psutil": version("psutil"),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if bench is not None:
        server = bench.redis.info("server")
        facts["redis-server"] = f"{server.get('redis_version')} ({bench.cluster.redis.url}, started by the bench)"
        conf = bench.app.conf
        facts["celery app"] = (
            f"worker/app.py: serializer {conf.task_serializer}/{conf.result_serializer}, "
            f"acks_late={conf.task_acks_late}, prefetch_multiplier={conf.worker_prefetch_multiplier}, "
            f"result_chord_ordered={conf.result_chord_ordered}, task events on, "
            "every task message signed and verified (HMAC-SHA256, worker/cluster/signing.py)"
        )
        facts["workers"] = (
            f"{len(WORKERS)} x `celery -A worker.app worker -P {POOL} -c {CONCURRENCY} -l info "
            f"--without-mingle --without-gossip` = {bench.processes} worker processes"
        )
    return facts
