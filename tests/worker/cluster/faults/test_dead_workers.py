"""A dead worker's work comes back within a minute, with default settings; a live worker's is never taken away.

Real redis-server, real `celery` workers (no fakes), CHORDFLOW_VISIBILITY_TIMEOUT left at its default (3600 s).
Every live worker renews every delivery it holds; the transport sweeps deliveries not renewed for the dead-delivery
bound (30 s) and restores them under a fresh delivery tag (worker/cluster/broker/deliveries.py). A worker that was only
paused past the bound is fenced when it wakes up: its chunk reports nothing (Ignore), its dataset chunk's finish is
refused (its claim was taken by the new delivery, worker/cluster/state/lua/dataset_step.lua).

Executions are counted in Redis by the `test-count` node (tests/support/counting_nodes.py): `<key>:runs` lists
"<worker> <label>" as each execution starts, `<key>:effects` counts the side effect of each label. Times are
measured from the signal to the run's end with the monotonic clock; the figures are in tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from scheduler import durable
from scheduler.datasets import reading
from scheduler.localcluster import Cluster, ManagedProcess
from scheduler.lookup import find_run
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.worker.cluster.faults.test_long_chunks import until
from worker.cluster.broker import deliveries
from worker.cluster.datasets.store import ClusterDataset
from worker.cluster.state.runs import ClusterRuns

#: The dead-delivery bound with default settings.
BOUND = deliveries.DEAD_DELIVERY_SECONDS
#: A dead worker's run must end within this many seconds of its death.
WITHIN = 90
FENCED = "was delivered again while this worker held it"
FENCED_RECORDS = "was delivered again meanwhile: this outcome is dropped"


@contextlib.contextmanager
def default_cluster(workdir: Path, workers: dict[str, dict[str, Any]] | None = None) -> Iterator[Cluster]:
    """Its own redis-server and workers (name -> `start_worker` options; default k1 and k2, solo), settings left
    at their defaults; this process points at it meanwhile."""
    cluster = Cluster(workdir, plugins=f"{PLUGINS},tests.support.counting_nodes")
    assert cluster.env["CHORDFLOW_VISIBILITY_TIMEOUT"] == "3600"  # the default
    previous = cluster.apply_env()
    try:
        for name, options in (workers or {"k1": {}, "k2": {}}).items():
            cluster.start_worker(name, **options)
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


@pytest.fixture
@starts("faults")
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with default_cluster(tmp_path) as made:
        yield made


class Counts:
    """What the `test-count` items of one test recorded in the cluster's Redis."""

    def __init__(self, cluster: Cluster):
        self.redis = redis.Redis.from_url(cluster.redis.url, decode_responses=True)
        self.key = f"t:{uuid.uuid4().hex[:8]}"

    def runs(self) -> list[tuple[str, str]]:
        """(worker, label) of every execution started, in order."""
        return [tuple(entry.split(" ", 1)) for entry in self.redis.lrange(f"{self.key}:runs", 0, -1)]  # type: ignore[misc]

    def started_by(self, worker: str) -> list[int]:
        return [int(label) for who, label in self.runs() if who == worker]

    def effects(self) -> dict[int, int]:
        return {int(label): int(n) for label, n in self.redis.hgetall(f"{self.key}:effects").items()}

    def hold(self, worker: str, label: int) -> None:
        self.redis.set(f"{self.key}:hold:{worker}:{label}", 1, ex=300)

    def release(self, worker: str, label: int) -> None:
        self.redis.delete(f"{self.key}:hold:{worker}:{label}")


def batch_workflow(counts: Counts, seconds: float, chunk_size: int) -> dict[str, Any]:
    node = {"id": "b", "type": "test-count", "params": {"key": counts.key, "label": "${item}", "seconds": seconds}}
    return {"nodes": [{**node, "batch": {"items": "${items}", "chunk_size": chunk_size}}]}


def record_workflow(counts: Counts, seconds: float) -> dict[str, Any]:
    return {
        "inputs": {"record": {"description": "one record"}},
        "nodes": [
            {
                "id": "work",
                "type": "test-count",
                "params": {"key": counts.key, "label": "${record.n}", "seconds": seconds},
            }
        ],
        "outputs": {"label": {"source": "${work.label}"}},
    }


def log_lines(cluster: Cluster, word: str, task: str = "") -> list[str]:
    """Lines of every worker's log that contain `word` (and, given `task`, are about a `task` task)."""
    found = []
    for worker in cluster.workers.values():
        text = worker.log.read_text() if worker.log.exists() else ""
        found += [line for line in text.splitlines() if word in line and (not task or f"{task}[" in line)]
    return found


def chunk_of(counts: Counts, worker: str, chunk_size: int) -> range:
    """The chunk `worker` runs now (from the first item it started)."""
    start = counts.started_by(worker)[0] // chunk_size * chunk_size
    return range(start, start + chunk_size)


def assert_aggregate_once(result: Any, total: int) -> None:
    assert result.status == "success", result.error
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], aggregate["error_count"]) == (total, total, 0)
    assert [r["label"] for r in aggregate["results"]] == [str(i) for i in range(total)]  # each index once, in order


def record_rows(run_id: str) -> list[dict[str, Any]]:
    record, _ = find_run(run_id)
    return list(reading.rows(record, is_final=lambda: True))


def kill_mid_chunk(cluster: Cluster, counts: Counts, sig: int) -> tuple[ManagedProcess, float]:
    """Signal k1 (its whole process group) once two items of its chunk have started; returns it and when."""
    victim = cluster.workers["k1"]
    until(lambda: len(counts.started_by("k1")) >= 2, 60, "k1 to run items")
    victim.kill(sig)
    return victim, time.monotonic()


# -- a worker dies ---------------------------------------------------------------------------------------------------


def test_a_sigkilled_workers_chunk_comes_back_within_a_minute_with_default_settings(cluster: Cluster) -> None:
    total, chunk_size = 60, 10
    counts = Counts(cluster)
    run_id = durable.submit(batch_workflow(counts, 0.3, chunk_size), {"items": list(range(total))})
    _, killed = kill_mid_chunk(cluster, counts, signal.SIGKILL)
    lost = chunk_of(counts, "k1", chunk_size)
    result = durable.wait(run_id, timeout=WITHIN + 30)
    seconds = time.monotonic() - killed
    assert seconds < WITHIN, f"the run ended {seconds:.1f}s after the kill"
    assert_aggregate_once(result, total)
    effects = counts.effects()
    assert set(effects) == set(range(total))  # every item ran (at least once)
    twice = sorted(i for i, n in effects.items() if n > 1)
    assert max(effects.values()) <= 2 and set(twice) <= set(lost), (twice, lost)  # only the killed chunk's, again
    print(f"\nSIGKILL mid-batch: run ended {seconds:.1f}s after the kill; side effects per index: "
          f"{dict(collections.Counter(effects.values()))} (ran twice: {twice})")  # fmt: skip


def test_a_sigkilled_workers_dataset_chunk_comes_back_within_a_minute_with_default_settings(cluster: Cluster) -> None:
    total, chunk_size = 60, 10
    counts = Counts(cluster)
    run_id = scheduler.submit(
        record_workflow(counts, 0.3), items=({"n": i} for i in range(total)), chunk_size=chunk_size
    )
    _, killed = kill_mid_chunk(cluster, counts, signal.SIGKILL)
    lost = chunk_of(counts, "k1", chunk_size)
    result = scheduler.wait(run_id, timeout=WITHIN + 30)
    seconds = time.monotonic() - killed
    assert seconds < WITHIN, f"the job ended {seconds:.1f}s after the kill"
    assert result.status == "success" and result.outputs == {"total": total, "done": total, "failed": 0}
    rows = record_rows(run_id)
    assert [(r["index"], r["result"]["label"]) for r in rows] == [(i, str(i)) for i in range(total)]  # one each
    effects = counts.effects()
    assert set(effects) == set(range(total))
    twice = sorted(i for i, n in effects.items() if n > 1)
    assert max(effects.values()) <= 2 and set(twice) <= set(lost), (twice, lost)
    print(f"\nSIGKILL mid-dataset-job: job ended {seconds:.1f}s after the kill; side effects per record: "
          f"{dict(collections.Counter(effects.values()))} (ran twice: {twice})")  # fmt: skip


# -- a worker is paused past the bound, then wakes up ----------------------------------------------------------------


def pause_until_taken_over(cluster: Cluster, counts: Counts, chunk_size: int) -> tuple[ManagedProcess, range, float]:
    """SIGSTOP k1 mid-chunk; hold k2 at the last item of that chunk once it is delivered to k2; returns k1, the
    chunk, and the seconds from the pause until k2 began the chunk."""
    victim, stopped = kill_mid_chunk(cluster, counts, signal.SIGSTOP)
    chunk = chunk_of(counts, "k1", chunk_size)
    counts.hold("k2", chunk[-1])
    until(lambda: ("k2", str(chunk[0])) in counts.runs(), BOUND + 60, "k1's chunk to be delivered to k2")
    taken = time.monotonic() - stopped
    until(lambda: ("k2", str(chunk[-1])) in counts.runs(), 60, "k2 to reach the chunk's last item")
    return victim, chunk, taken


def test_a_worker_paused_past_the_bound_adds_no_second_outcome_to_a_batch(cluster: Cluster) -> None:
    total, chunk_size = 40, 10
    counts = Counts(cluster)
    run_id = durable.submit(batch_workflow(counts, 0.3, chunk_size), {"items": list(range(total))})
    victim, chunk, taken = pause_until_taken_over(cluster, counts, chunk_size)
    assert BOUND - 6 < taken < BOUND + 15, taken  # not before the bound: paused is not yet dead
    victim.kill(signal.SIGCONT)  # k1 wakes up and finishes its stale chunk while k2 holds the new delivery
    victim.wait_for_line(FENCED, timeout=60)
    # The stale chunk reported nothing: the chord is still waiting for the chunk k2 holds.
    assert ClusterRuns().get(run_id).status == "running"
    assert not log_lines(cluster, "received", "chordflow.aggregate")
    counts.release("k2", chunk[-1])
    result = durable.wait(run_id, timeout=60)
    assert_aggregate_once(result, total)
    assert len(log_lines(cluster, "received", "chordflow.aggregate")) == 1  # the chord body ran once
    assert len(log_lines(cluster, FENCED)) == 1  # one WARNING line
    effects = counts.effects()
    assert effects == {i: 2 if i in chunk else 1 for i in range(total)}  # k1 and k2 each ran the chunk through
    print(f"\nSIGSTOP mid-batch: chunk delivered again {taken:.1f}s after the pause; k1 woke up fenced; "
          f"aggregate: each index once; side effects: {dict(collections.Counter(effects.values()))}")  # fmt: skip


def test_a_worker_paused_past_the_bound_adds_no_second_outcome_to_a_dataset_job(cluster: Cluster) -> None:
    total, chunk_size = 40, 10
    counts = Counts(cluster)
    run_id = scheduler.submit(
        record_workflow(counts, 0.3), items=({"n": i} for i in range(total)), chunk_size=chunk_size
    )
    victim, chunk, taken = pause_until_taken_over(cluster, counts, chunk_size)
    assert BOUND - 6 < taken < BOUND + 15, taken
    victim.kill(signal.SIGCONT)
    victim.wait_for_line(FENCED_RECORDS, timeout=60)
    ds = ClusterDataset(run_id)
    assert ClusterRuns().get(run_id).status == "running"
    assert ds.counts()["done"] == total - chunk_size  # the stale finish counted nothing
    assert ds.is_pending(chunk[0] // chunk_size)
    # No record outcome comes in while k2 holds the chunk: past the bound `status` shows no ETA rather than "1s".
    assert scheduler.status(run_id)["records"]["eta_s"] is not None  # k1's stale items came in just now
    held = time.monotonic()
    until(lambda: scheduler.status(run_id)["records"]["eta_s"] is None, BOUND + 15, "status to drop its ETA")
    no_eta = time.monotonic() - held
    assert no_eta > BOUND - 5, no_eta
    counts.release("k2", chunk[-1])
    result = scheduler.wait(run_id, timeout=60)
    assert result.status == "success" and result.outputs == {"total": total, "done": total, "failed": 0}
    assert ds.counts()["done"] == total
    rows = record_rows(run_id)
    assert [(r["index"], r["result"]["label"]) for r in rows] == [(i, str(i)) for i in range(total)]
    assert len(log_lines(cluster, FENCED_RECORDS)) == 1
    effects = counts.effects()
    assert effects == {i: 2 if i in chunk else 1 for i in range(total)}
    print(f"\nSIGSTOP mid-dataset-job: chunk delivered again {taken:.1f}s after the pause; k1's finish refused; "
          f"records done {total}; side effects: {dict(collections.Counter(effects.values()))}; "
          f"ETA gone {no_eta:.1f}s after the last outcome")  # fmt: skip


# -- a live worker keeps what it holds -------------------------------------------------------------------------------


@pytest.mark.processes
def test_a_live_prefork_workers_running_and_prefetched_messages_are_delivered_once(tmp_path: Path) -> None:
    """One prefork worker, one pool process, two prefetched: a dataset chunk and a batch chunk of BOUND + 8 s each.
    One runs in the child while the other waits reserved in the main process for longer than the bound; the main
    process renews both, so neither is delivered again."""
    seconds = BOUND + 8
    prefetching = {"pool": "prefork", "concurrency": 1, "args": ("--prefetch-multiplier", "2")}
    with default_cluster(tmp_path, {"k1": prefetching}) as cluster:
        counts = Counts(cluster)
        job = scheduler.submit(record_workflow(counts, seconds), items=[{"n": 1}], chunk_size=1)
        batch = durable.submit(batch_workflow(counts, seconds, 1), {"items": [0]})
        assert_aggregate_once(durable.wait(batch, timeout=2 * seconds + 60), 1)
        assert scheduler.wait(job, timeout=2 * seconds + 60).outputs == {"total": 1, "done": 1, "failed": 0}
        started = counts.runs()
        assert counts.effects() == {0: 1, 1: 1} and len(started) == 2  # each started once, one after the other
        assert len(log_lines(cluster, "received", "chordflow.run_chunk")) == 1
        assert len(log_lines(cluster, "received", "chordflow.dataset_chunk")) == 1
        assert not log_lines(cluster, FENCED)


@pytest.mark.processes
def test_a_paused_workers_prefetched_chunk_does_not_start_when_it_wakes_up(tmp_path: Path) -> None:
    """k1 (prefork, one process, two prefetched) is paused past the bound holding a running chunk and a reserved one;
    both are delivered again. Woken up, k1 finishes the stale running chunk (reports nothing) and does not start
    its stale reserved one (the new delivery of that chunk runs, on k2 or on k1 itself)."""
    total, chunk_size = 60, 10
    prefetching = {"pool": "prefork", "concurrency": 1, "args": ("--prefetch-multiplier", "2")}
    with default_cluster(tmp_path, {"k1": prefetching, "k2": {}}) as cluster:
        counts = Counts(cluster)
        broker = redis.Redis.from_url(cluster.redis.url)
        run_id = durable.submit(batch_workflow(counts, 0.3, chunk_size), {"items": list(range(total))})
        until(lambda: broker.hlen("unacked") >= 3, 60, "k1 to hold two chunks and k2 one")
        victim, chunk, taken = pause_until_taken_over(cluster, counts, chunk_size)
        victim.kill(signal.SIGCONT)
        until(lambda: len(log_lines(cluster, FENCED)) >= 2, 60, "k1 to fence its running and its reserved chunk")
        fenced = log_lines(cluster, FENCED)
        assert sum("its outcome is dropped" in line for line in fenced) == 1
        assert sum("it does not run here" in line for line in fenced) == 1
        assert ClusterRuns().get(run_id).status == "running"  # nothing k1 did fired the chord body
        counts.release("k2", chunk[-1])
        assert_aggregate_once(durable.wait(run_id, timeout=60), total)
        assert len(log_lines(cluster, "received", "chordflow.aggregate")) == 1
        effects = counts.effects()
        assert effects == {i: 2 if i in chunk else 1 for i in range(total)}  # the reserved chunk ran once (k2)
        started = collections.Counter(int(label) for _, label in counts.runs())
        assert started == {i: 2 if i in chunk else 1 for i in range(total)}  # the stale reserved chunk never started
        print(f"\nSIGSTOP with a prefetched chunk: delivered again {taken:.1f}s after the pause; k1 fenced both; "
              f"side effects: {dict(collections.Counter(effects.values()))}")  # fmt: skip
