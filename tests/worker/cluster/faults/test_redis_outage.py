"""Redis outages, with a real redis-server stopped and started again under real workers.

With persistence (AOF) a restart is an outage to ride out: workers reconnect (forever, with backoff),
every Redis command retries for up to a minute (worker/cluster/outage.py), and the run ends as if
nothing happened, each item's outcome once. Without persistence the run's state is gone: whoever follows
the run says so in one line, within a minute, instead of waiting forever.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import scheduler
from ir.errors import BackendError
from scheduler import durable
from scheduler.localcluster import Cluster
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker.cluster.state.runstate import RunState

#: How long Redis stays down in the restart test (the issue asks for up to 10 s).
DOWN_SECONDS = 8


def slow_batch(seconds: float, chunk_size: int | None = None) -> dict:
    batch: dict = {"items": "${items}"}
    if chunk_size:
        batch["chunk_size"] = chunk_size
    return {"nodes": [{"id": "b", "type": "test-slow", "params": {"seconds": seconds}, "batch": batch}]}


@pytest.fixture
@starts("faults")
def aof_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Its own redis-server with AOF (fsync on every write), and two workers."""
    cluster = Cluster(tmp_path, plugins=PLUGINS, redis_args=["--appendonly", "yes", "--appendfsync", "always"])
    previous = cluster.apply_env()
    try:
        cluster.start_worker("o1")
        cluster.start_worker("o2", via="chordflow")
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def wait_for_items(run_id: str, items: int, timeout: float = 120) -> None:
    """Block on the run's progress stream until `items` outcomes were published."""
    state = RunState(run_id)
    position, seen, deadline = "0-0", 0, time.monotonic() + timeout
    while seen < items:
        assert time.monotonic() < deadline, f"only {seen} of {items} items ran within {timeout}s"
        position, entries = state.read_progress(position, 500)
        seen += sum(len(RunState.unpack_outcomes(packed)) for _, packed in entries if packed)


def outage(cluster: Cluster, seconds: float) -> float:
    """Stop Redis (SIGTERM: it writes its AOF and exits, as a restart does), keep it down, start it again."""
    started = time.monotonic()
    cluster.redis.kill(signal.SIGTERM)
    time.sleep(seconds)  # the length of the outage itself, not a wait for anything
    cluster.redis.restart()
    return time.monotonic() - started


def test_a_redis_restart_mid_batch_with_aof_loses_and_duplicates_nothing(aof_cluster: Cluster) -> None:
    total = 100_000
    run_id = durable.submit(slow_batch(0.0002, chunk_size=2_000), {"items": list(range(total))})
    wait_for_items(run_id, 10_000)
    down = outage(aof_cluster, DOWN_SECONDS)
    result = durable.wait(run_id, timeout=240)  # this process rides out the restart too
    assert result.status == "success", result.error
    assert down >= DOWN_SECONDS
    assert [r["index"] for r in result.shared["b"]["results"]] == list(range(total))  # each once, in order
    for worker in aof_cluster.workers.values():
        assert worker.proc.poll() is None  # no worker gave up on the broker
    after = scheduler.run(slow_batch(0, chunk_size=5), {"items": list(range(20))}, backend="celery")
    assert after.shared["b"]["count"] == 20  # and they still serve


def test_workers_outlive_a_long_broker_outage(aof_cluster: Cluster) -> None:
    outage(aof_cluster, 15)  # longer than the ~12 s after which workers used to exit for good
    result = scheduler.run(slow_batch(0, chunk_size=5), {"items": list(range(20))}, backend="celery")
    assert [r["index"] for r in result.shared["b"]["results"]] == list(range(20))
    for worker in aof_cluster.workers.values():
        assert worker.proc.poll() is None


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Run `call` on a thread; the list receives what it raised."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            call()
        except BaseException as exc:  # what the call raised is the assertion
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, raised


@pytest.mark.processes
def test_without_persistence_a_lost_run_is_one_clear_error_not_a_hang(tmp_path: Path) -> None:
    """Both ways of following a run: `wait` on a cluster run, and the client-orchestrated `scheduler.run`."""
    cluster = Cluster(tmp_path, plugins=PLUGINS)  # its own Redis, no persistence, and one worker
    previous = cluster.apply_env()
    try:
        cluster.start_worker("n1")
        run_id = durable.submit(slow_batch(0.01, chunk_size=10), {"items": list(range(3_000))})
        waiting, wait_raised = in_thread(lambda: durable.wait(run_id, timeout=120))
        running, run_raised = in_thread(
            lambda: scheduler.run(slow_batch(0.01, 10), {"items": list(range(3_000))}, backend="celery", run_id="lost")
        )
        wait_for_items(run_id, 20)
        wait_for_items("lost", 20)
        outage(cluster, 1)
        started = time.monotonic()
        for thread in (waiting, running):
            thread.join(timeout=90)
            assert not thread.is_alive(), "still following a run whose state is gone"
        assert time.monotonic() - started < 60
        assert len(wait_raised) == 1 and isinstance(wait_raised[0], BackendError), wait_raised
        assert f"run {run_id}: its state was lost from Redis" in str(wait_raised[0])
        assert len(run_raised) == 1 and isinstance(run_raised[0], BackendError), run_raised
        assert "run lost: its state was lost from Redis during batch node 'b'" in str(run_raised[0])
    finally:
        cluster.restore_env(previous)
        cluster.stop()
