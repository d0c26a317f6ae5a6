"""Measuring the cluster: what `chordflow metrics` serves to Prometheus, what `chordflow top` shows, and the
in-process metrics of a worker (`chordflow worker --metrics-port`).

`ClusterView.snapshot()` reads the cluster's state from Redis at once, never one read per item:

- runs: the run index (`cf:runs`) and one HMGET per run record (the workflow's name is read once per run);
- progress of a running run: its progress stream (worker/cluster/state/runstate.py), read from where the last snapshot
  stopped (at most STREAM_ENTRIES entries per run per snapshot), each item outcome counted once per index
  (a redelivered chunk repeats some); a dataset job's record counts (worker/cluster/datasets/);
- model calls: a run's `__llm_calls__` (one pipelined HGET of that store key per run whose record changed since the
  last snapshot: a finished run's is read once), summed by model into counters that never go down
  (scheduler/ops/usage.py);
- workers: the worker registry (worker/cluster/state/heartbeat.py);
- the workers wanted: the pool slots the queued work can keep busy, capped by rate limits and `max_concurrent`
  (scheduler/ops/demand.py: a few reads per active run and per open batch);
- the broker: each queue's waiting messages and the age of the next one a worker takes (from the time it was
  sent, `chordflow_sent_at`, stamped by worker/cluster/broker/pool.py), and on Redis the messages delivered and
  not yet acknowledged: read as each broker allows (worker/cluster/broker/redis.py, amqp.py).

`ClusterCollector` turns a snapshot into Prometheus metrics at scrape time. `WorkerMetrics` counts and times
what one worker does (chunks, items, advances, time in the queue) in every process of its pool, with
prometheus_client's multiprocess mode: a prefork worker runs tasks in child processes, and each writes its
values to files in PROMETHEUS_MULTIPROC_DIR that the main process adds up when scraped.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import redis

from ir import snapshot
from scheduler.ops import demand, usage
from worker import settings
from worker.cluster.broker.base import QueueView
from worker.cluster.broker.pool import SENT_AT_HEADER
from worker.cluster.broker.registry import for_settings as broker_for
from worker.cluster.datasets.store import ClusterDataset
from worker.cluster.messages import ADVANCE
from worker.cluster.state import connection, heartbeat
from worker.cluster.state.keys import RUNS, RunKeys
from worker.cluster.state.progress import BatchProgress, StreamProgress
from worker.datasets.job import RECORDS
from worker.llm import usage as llm_usage
from worker.runs.record import STATUSES
from worker.waits import Waiting

log = logging.getLogger(__name__)

#: Progress stream entries read per running run per snapshot: a snapshot stays short however far behind it is
#: (a collector started during a long run catches up over a few scrapes).
STREAM_ENTRIES = 2000
#: Run statuses whose runs are shown as active.
ACTIVE = ("queued", "running")
#: Seconds a Redis command of a snapshot may take (connecting included) before the snapshot fails.
SCRAPE_TIMEOUT = 5.0


# -- what the cluster is doing ---------------------------------------------------------------------------------


@dataclass
class RunView:
    run_id: str
    workflow: str
    status: str
    node: str | None
    created: float
    updated: float
    dataset: bool
    batches: list[BatchProgress] = field(default_factory=list)
    total_known: bool = True  # False while a dataset job's file is still being read
    llm: dict[str, Any] | None = None  # `usage_totals` of the run's model calls (None: it keeps no `__llm_calls__`)
    waiting: Waiting | None = None  # what its `wait` node waits for, if it waits

    @property
    def done(self) -> int:
        return sum(b.done for b in self.batches)

    @property
    def failed(self) -> int:
        return sum(b.failed for b in self.batches)

    @property
    def items(self) -> int:
        return sum(b.total for b in self.batches)

    @property
    def current(self) -> BatchProgress | None:
        """The batch going on: the last one dispatched that has not finished."""
        going = [b for b in self.batches if not b.finished]
        return going[-1] if going else None


@dataclass
class ClusterSnapshot:
    taken: float
    runs: Counter[tuple[str, str]]  # (status, workflow) -> runs recorded in Redis
    active: list[RunView]  # queued and running runs, oldest first
    queues: list[QueueView]
    unacked: int | None  # None: the broker keeps no such count (not Redis, or no ack emulation)
    workers: dict[str, int]  # hostname -> pool processes
    llm: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> counters (usage.FIELDS) of every run
    desired: demand.Desired = field(default_factory=demand.Desired)  # what KEDA scales the workers on


def scrape_client(url: str) -> redis.Redis:
    """A Redis client that fails within SCRAPE_TIMEOUT instead of riding out an outage (runstate.client retries for
    a minute): a scrape must answer before Prometheus gives up on it, saying `chordflow_up 0`."""
    return connection.open_client(url, socket_timeout=SCRAPE_TIMEOUT, socket_connect_timeout=SCRAPE_TIMEOUT)


class ClusterView:
    """Snapshots of the cluster (see the module docstring); one instance keeps the progress it has read.

    Parameters: the settings (its result backend holds the run state, its broker the queues), the queues to
    measure (default: CHORDFLOW_QUEUE), whether to count every run's model calls (the metrics' counters) or
    only the active runs' (what `top` shows), and the pool slots of a worker while none is registered (the desired
    workers when scaling from zero)."""

    def __init__(
        self,
        s: settings.Settings | None = None,
        queues: Iterable[str] = (),
        every_run: bool = True,
        worker_slots: int = 1,
    ):
        self.settings = s or settings.load()
        self.redis = scrape_client(self.settings.result_backend)
        self.broker = broker_for(self.settings)
        self.queues = list(queues) or [self.settings.queue]
        self._names: dict[str, str] = {}  # run id -> workflow name (a run's workflow never changes)
        self._limits: dict[str, dict[str, demand.Limits]] = {}  # run id -> its batch nodes' limits
        self.worker_slots = worker_slots
        self._progress: dict[str, StreamProgress] = {}
        self._usage: dict[str, tuple[str, dict[str, Any] | None]] = {}  # run id -> (its `updated`, its llm totals)
        self._llm = usage.ModelCounters()
        self._every_run = every_run
        self._lock = threading.Lock()

    def snapshot(self) -> ClusterSnapshot:
        with self._lock:  # concurrent scrapes: one reads the streams at a time
            now = time.time()
            runs, active = self._runs()
            broker = self.broker.read_queues(self.queues, now)
            llm = {model: dict(counts) for model, counts in self._llm.totals.items()}
            workers = heartbeat.pool_sizes(self.redis)
            desired = demand.desired(self.redis, active, self._limits, workers, self.worker_slots)
            return ClusterSnapshot(now, runs, active, broker.queues, broker.unacked, workers, llm, desired)

    def _runs(self) -> tuple[Counter[tuple[str, str]], list[RunView]]:
        ids = [raw.decode() for raw in self.redis.zrange(RUNS, 0, -1)]
        fields = ("status", "node", "created", "updated", "source", "dataset", "waiting")
        pipe = self.redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.hmget(RunKeys(run_id).run, fields)
        records = {}
        for run_id, values in zip(ids, pipe.execute(), strict=True):
            if values[0] is not None:  # expired since it was indexed
                records[run_id] = dict(zip(fields, (v.decode() if v is not None else "" for v in values), strict=True))
        self._name_runs([run_id for run_id in records if run_id not in self._names], records)
        self._read_usage(records if self._every_run else {k: v for k, v in records.items() if v["status"] in ACTIVE})
        counts: Counter[tuple[str, str]] = Counter()
        active = []
        for run_id, record in records.items():
            name = self._names.get(run_id, "workflow")
            counts[(record["status"], name)] += 1
            if record["status"] in ACTIVE:
                view = RunView(
                    run_id, name, record["status"], record["node"] or None, float(record["created"] or 0),
                    float(record["updated"] or 0), bool(record["dataset"]), llm=self._usage[run_id][1],
                    waiting=Waiting.from_wire(json.loads(record["waiting"])) if record["waiting"] else None,
                )  # fmt: skip
                active.append(view)
        self._read_progress([v for v in active if v.status == "running"])
        for gone in set(self._names) - set(records):
            del self._names[gone]
            self._limits.pop(gone, None)
        for gone in set(self._progress) - {v.run_id for v in active}:
            del self._progress[gone]
        return counts, sorted(active, key=lambda v: v.created)

    def _name_runs(self, ids: list[str], records: dict[str, dict[str, str]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for run_id in ids:
            pipe.hget(RunKeys(run_id).run, "workflow")
        for run_id, raw in zip(ids, pipe.execute() if ids else [], strict=True):
            try:
                workflow = json.loads(raw) if raw else {}
            except ValueError:
                workflow = {}
            self._names[run_id] = str(workflow.get("name") or records[run_id]["source"] or "workflow")
            self._limits[run_id] = demand.batch_limits(workflow)

    def _read_usage(self, records: dict[str, dict[str, str]]) -> None:
        """The model calls of each run whose record changed since the last snapshot (every checkpoint sets its
        `updated`), into the run's totals and the counters; a run gone from Redis is forgotten (its counts stay)."""
        seen = {run_id: updated for run_id, (updated, _) in self._usage.items()}
        changed = [run_id for run_id, record in records.items() if seen.get(run_id) != record["updated"]]
        pipe = self.redis.pipeline(transaction=False)
        for run_id in changed:
            pipe.hget(RunKeys(run_id).store, usage.CALLS)
        for run_id, blob in zip(changed, pipe.execute() if changed else [], strict=True):
            calls = snapshot.decode(blob) if blob is not None else None
            if records[run_id]["dataset"]:  # a dataset job's calls are summed by model as its chunks finish
                calls = llm_usage.entries(ClusterDataset(run_id).model_calls()) or None
            self._usage[run_id] = (records[run_id]["updated"], usage.totals(calls))
            self._llm.see(run_id, usage.by_model(calls))
        for gone in set(self._usage) - set(records):
            del self._usage[gone]
            self._llm.forget(gone)

    def _read_progress(self, running: list[RunView]) -> None:
        batch_runs = [v for v in running if not v.dataset]
        pipe = self.redis.pipeline(transaction=False)
        for view in batch_runs:
            progress = self._progress.setdefault(view.run_id, StreamProgress())
            # The stream first: a batch's total is stored before its chunks are sent, so every batch the entries
            # read name has its total in the read after them.
            keys = RunKeys(view.run_id)
            pipe.xread({keys.events: progress.position}, count=STREAM_ENTRIES)
            pipe.hgetall(keys.totals)
        replies = pipe.execute() if batch_runs else []
        for position, view in enumerate(batch_runs):
            totals = {k.decode(): int(v) for k, v in replies[2 * position + 1].items()}
            progress = self._progress[view.run_id]
            for _stream, entries in replies[2 * position] or []:
                progress.read(entries, totals)
            view.batches = list(progress.batches.values())
        datasets = [v for v in running if v.dataset]
        pipe = self.redis.pipeline(transaction=False)
        for view in datasets:
            pipe.hmget(RunKeys(view.run_id).dataset.job, ["total", "read", "done", "failed"])
        for view, (total, read, done, failed) in zip(datasets, pipe.execute() if datasets else [], strict=True):
            view.total_known = total is not None
            known = int(total if total is not None else read or 0)
            view.batches = [BatchProgress(RECORDS, RECORDS, known, int(done or 0), int(failed or 0))]


# -- Prometheus: the cluster, at scrape time -------------------------------------------------------------------


class ClusterCollector:
    """The cluster's metrics, computed from a fresh snapshot at every scrape (a prometheus_client Collector)."""

    def __init__(self, view: ClusterView):
        self.view = view

    def describe(self) -> list[Any]:
        return []  # nothing read from Redis when the collector is registered

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("chordflow_up", "1 when chordflow's Redis (state and broker) answered this scrape.")
        try:
            snap = self.view.snapshot()
        except Exception as exc:  # Redis away, a wrong password...: say so in a metric, not with a 500
            log.warning("cannot read the cluster's state: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up

        runs = GaugeMetricFamily(
            "chordflow_runs", "Cluster runs recorded in Redis (within CHORDFLOW_RUN_TTL), by status and workflow.",
            labels=["status", "workflow"],
        )  # fmt: skip
        for workflow in sorted({w for _, w in snap.runs}):
            for status in STATUSES:
                runs.add_metric([status, workflow], snap.runs.get((status, workflow), 0))
        yield runs

        labels = ["run", "workflow"]
        items = GaugeMetricFamily("chordflow_run_items", "Items of a running run's batches so far.", labels=labels)
        done = GaugeMetricFamily(
            "chordflow_run_items_done", "Items of a running run with an outcome (failed included).", labels=labels
        )
        failed = GaugeMetricFamily("chordflow_run_items_failed", "Items of a running run that failed.", labels=labels)
        ratio = GaugeMetricFamily(
            "chordflow_batch_progress_ratio", "Items with an outcome / items, of a running run's batch going on.",
            labels=["run", "node"],
        )  # fmt: skip
        for view in snap.active:
            if view.status != "running":
                continue
            items.add_metric([view.run_id, view.workflow], view.items)
            done.add_metric([view.run_id, view.workflow], view.done)
            failed.add_metric([view.run_id, view.workflow], view.failed)
            if view.current is not None:
                ratio.add_metric([view.run_id, view.current.node], view.current.ratio)
        yield from (items, done, failed, ratio)

        depth = GaugeMetricFamily(
            "chordflow_queue_messages", "Task messages waiting in a chordflow queue (every priority).", labels=["queue"]
        )
        age = GaugeMetricFamily(
            "chordflow_queue_oldest_message_age_seconds",
            "Seconds since the message a worker takes next from the queue was sent (0 when the queue is empty).",
            labels=["queue"],
        )
        for queue in snap.queues:
            depth.add_metric([queue.name], queue.messages)
            if queue.oldest_age is not None or queue.messages == 0:
                age.add_metric([queue.name], queue.oldest_age or 0.0)
        yield from (depth, age)
        if snap.unacked is not None:
            in_flight = GaugeMetricFamily(
                "chordflow_chunks_in_flight",
                "Task messages delivered to a worker and not yet acknowledged: chunks running or prefetched (and the "
                "short advance and aggregate tasks while they run).",
            )
            in_flight.add_metric([], snap.unacked)
            yield in_flight
        yield from _llm_metrics(snap.llm)
        workers = GaugeMetricFamily("chordflow_workers", "Workers in the registry (alive: heartbeat within its TTL).")
        workers.add_metric([], len(snap.workers))
        processes = GaugeMetricFamily("chordflow_worker_processes", "Pool processes of the registered workers.")
        processes.add_metric([], sum(snap.workers.values()))
        yield from (workers, processes)
        slots = GaugeMetricFamily(
            "chordflow_desired_pool_slots", "Pool slots the queued and running work can keep busy: chunks waiting and "
            "running, capped by what rate limits (rate x seconds a call runs) and max_concurrent let run at once; "
            "1 per queued run or advance; 0 when idle.",
        )  # fmt: skip
        slots.add_metric([], snap.desired.slots)
        wanted = GaugeMetricFamily(
            "chordflow_desired_workers", "Workers for chordflow_desired_pool_slots: ceil(slots / a registered "
            "worker's pool processes, else chordflow metrics --worker-slots). What KEDA scales the workers on.",
        )  # fmt: skip
        wanted.add_metric([], snap.desired.workers)
        yield from (slots, wanted)


def _llm_metrics(counters: dict[str, dict[str, float]]) -> Iterator[Any]:
    """The model calls of cluster runs by model (`__llm_calls__`, what `status` sums per run), as counters."""
    from prometheus_client.core import CounterMetricFamily

    calls = CounterMetricFamily(
        "chordflow_llm_calls", "Model calls (llm nodes' requests, answered or reused) of cluster runs, by model.",
        labels=["model"],
    )  # fmt: skip
    cached = CounterMetricFamily(
        "chordflow_llm_cached_calls", "Model calls answered by an answer already paid for (nothing billed), by model.",
        labels=["model"],
    )  # fmt: skip
    tokens = CounterMetricFamily(
        "chordflow_llm_tokens", "Tokens the providers billed for cluster runs' model calls, by model and direction.",
        labels=["model", "direction"],
    )  # fmt: skip
    cost = CounterMetricFamily(
        "chordflow_llm_cost_usd", "USD of cluster runs' model calls, by model: only models priced in "
        "CHORDFLOW_LLM_PRICES.", labels=["model"],
    )  # fmt: skip
    for model, counts in sorted(counters.items()):
        calls.add_metric([model], counts["calls"])
        cached.add_metric([model], counts["cached_calls"])
        tokens.add_metric([model, "input"], counts["input_tokens"])
        tokens.add_metric([model, "output"], counts["output_tokens"])
        if "cost_usd" in counts:
            cost.add_metric([model], counts["cost_usd"])
    yield from (calls, cached, tokens, cost)


def serve_cluster_metrics(port: int, address: str, queues: Iterable[str] = (), worker_slots: int = 1) -> Any:
    """Serve the cluster's metrics on http://address:port/metrics from a daemon thread; returns the server.
    `worker_slots`: a worker's pool slots while none is registered (desired workers from zero)."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector(ClusterView(queues=queues, worker_slots=worker_slots)))
    server, _thread = start_http_server(port, address, registry=registry)
    return server


# -- Prometheus: one worker's own work, in every process of its pool ------------------------------------------------

#: Chunk durations range from milliseconds to the visibility timeout (an hour by default).
CHUNK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: An advance runs nodes until a batch is dispatched: usually milliseconds, longer when its nodes are slow.
ADVANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
#: Time in the queue: zero when workers keep up, minutes when they do not.
WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)


class WorkerMetrics:
    """The metrics of one worker: its chunks (duration, items by outcome), its advances (duration), and how long
    its tasks waited in the queue. Labels are bounded: `node` (a workflow's node ids), `outcome` (ok, failed),
    `task` (chordflow's task names) — never a run id, which would add series for every run a long-lived worker
    ever ran (per-run numbers come from `chordflow metrics`, while the run is running).

    Built after PROMETHEUS_MULTIPROC_DIR is set (`serve_worker_metrics`): the values live in files every pool
    process writes."""

    def __init__(self) -> None:
        from prometheus_client import Counter as PromCounter
        from prometheus_client import Histogram

        self.chunk_seconds = Histogram(
            "chordflow_chunk_duration_seconds", "Seconds a chunk took on this worker, by batch node ('records': a "
            "dataset job's).", ["node"], buckets=CHUNK_BUCKETS, registry=None,
        )  # fmt: skip
        self.items = PromCounter(
            "chordflow_items_processed", "Items this worker ran, by batch node and outcome (ok, failed).",
            ["node", "outcome"], registry=None,
        )  # fmt: skip
        self.advance_seconds = Histogram(
            "chordflow_advance_duration_seconds", "Seconds a chordflow.advance task ran (its nodes until a batch).",
            buckets=ADVANCE_BUCKETS, registry=None,
        )  # fmt: skip
        self.wait_seconds = Histogram(
            "chordflow_task_wait_seconds", "Seconds between sending a task and this worker starting it, by task.",
            ["task"], buckets=WAIT_BUCKETS, registry=None,
        )  # fmt: skip
        self._started: dict[str, float] = {}

    def on_event(self, event: str, fields: dict[str, Any]) -> None:
        """A worker/cluster/logs.py listener: each chunk's line is counted here too."""
        if event != "chunk":
            return
        node = str(fields["node"])
        self.chunk_seconds.labels(node).observe(fields["seconds"])
        ok = fields["items"] - fields["failed"]
        if ok:
            self.items.labels(node, "ok").inc(ok)
        if fields["failed"]:
            self.items.labels(node, "failed").inc(fields["failed"])

    def task_started(self, task_id: str | None = None, task: Any = None, **_: Any) -> None:
        name = getattr(task, "name", "") or ""
        if not name.startswith("chordflow.") or task_id is None:
            return
        sent = getattr(task.request, SENT_AT_HEADER, None)
        if isinstance(sent, int | float):
            self.wait_seconds.labels(name).observe(max(0.0, time.time() - sent))
        if name == ADVANCE:
            self._started[task_id] = time.monotonic()

    def task_ended(self, task_id: str | None = None, **_: Any) -> None:
        started = self._started.pop(task_id or "", None)
        if started is not None:
            self.advance_seconds.observe(time.monotonic() - started)


def serve_worker_metrics(port: int, address: str) -> Any:
    """Serve this worker's metrics (`WorkerMetrics`, added up over every process of its pool) on
    http://address:port/metrics from a daemon thread of this (the main) process; call before the worker starts,
    so the pool processes it forks count too. Returns the server.

    PROMETHEUS_MULTIPROC_DIR: an empty directory of the operator's, or a new temporary one (removed at exit)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        directory = tempfile.mkdtemp(prefix="chordflow-worker-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        owner = os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(directory, ignore_errors=True))
    from celery import signals
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    from worker.cluster import logs

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    server, _thread = start_http_server(port, address, registry=registry)
    metrics = WorkerMetrics()
    logs.listeners.append(metrics.on_event)
    signals.task_prerun.connect(metrics.task_started, weak=False)
    signals.task_postrun.connect(metrics.task_ended, weak=False)
    return server
