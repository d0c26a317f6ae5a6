"""The worker registry: workers keep their pool size in Redis under a heartbeat TTL; chunk sizing reads it
instead of broadcasting to the workers. Real redis-server and real worker processes."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import signals

import scheduler
from scheduler.localcluster import Cluster, ManagedProcess
from tests.support import dist_nodes  # noqa: F401  (the test node types, in this process too)
from tests.support.kinds import starts
from worker.cluster.batches import chunking
from worker.cluster.state import heartbeat, keys

PLUGINS = "tests.support.nodes,tests.support.dist_nodes"
HOST = socket.gethostname()


@pytest.fixture
@starts("cluster")
def fast_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A cluster of its own whose workers beat every second (an entry lives 3 s), with key-event
    notifications on, so a test can wait for an entry to be deleted or to expire."""
    cluster = Cluster(tmp_path, plugins=PLUGINS, base_env={**os.environ, "CHORDFLOW_WORKER_HEARTBEAT": "1"})
    previous = cluster.apply_env()
    try:
        redis.Redis.from_url(cluster.redis.url).config_set("notify-keyspace-events", "Egx")
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def key_removals(client: redis.Redis) -> redis.client.PubSub:
    """A subscription to the server's `del` and `expired` key events."""
    events = client.pubsub()
    events.subscribe("__keyevent@0__:del", "__keyevent@0__:expired")
    return events


def wait_for_removal(events: redis.client.PubSub, key: str, deadline: float) -> str:
    """How `key` went away (`del` or `expired`), waiting until `deadline`; fails the test if it stays."""
    while time.monotonic() < deadline:
        message = events.get_message(timeout=deadline - time.monotonic())
        if message and message["type"] == "message" and message["data"].decode() == key:
            return message["channel"].decode().rsplit(":", 1)[1]
    pytest.fail(f"no key event on {key} before the deadline")


def test_live_workers_register_their_pool_size_and_a_killed_ones_entry_expires(fast_cluster: Cluster) -> None:
    fast_cluster.start_worker("r1", pool="threads", concurrency=3)  # `celery -A worker.app worker`
    fast_cluster.start_worker("r2", via="chordflow")  # `chordflow worker`
    client = redis.Redis.from_url(fast_cluster.redis.url)
    assert heartbeat.pool_sizes(client) == {f"r1@{HOST}": 3, f"r2@{HOST}": 1}  # registered before "ready."
    events = key_removals(client)
    fast_cluster.workers["r1"].kill(signal.SIGKILL)  # no shutdown: nothing deletes its entry
    assert wait_for_removal(events, keys.worker_key(f"r1@{HOST}"), time.monotonic() + 30) == "expired"
    assert heartbeat.pool_sizes(client) == {f"r2@{HOST}": 1}  # r2's heartbeat kept it alive meanwhile


def test_a_worker_that_shuts_down_deletes_its_entry(fast_cluster: Cluster) -> None:
    fast_cluster.start_worker("r3")
    client = redis.Redis.from_url(fast_cluster.redis.url)
    assert heartbeat.pool_sizes(client) == {f"r3@{HOST}": 1}
    events = key_removals(client)
    fast_cluster.workers["r3"].kill(signal.SIGTERM)  # warm shutdown
    assert wait_for_removal(events, keys.worker_key(f"r3@{HOST}"), time.monotonic() + 30) == "del"
    assert heartbeat.pool_sizes(client) == {}


def test_chunk_sizing_uses_the_registered_pool_sizes(fast_cluster: Cluster) -> None:
    fast_cluster.start_worker("r4", pool="threads", concurrency=3)
    fast_cluster.start_worker("r5")
    assert chunking.registered_processes(fast_cluster.redis.url) == 4
    published: list[str] = []

    def on_publish(sender: str, **_: Any) -> None:
        published.append(sender)

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}
        result = scheduler.run(wf, {"items": list(range(400))}, backend="celery")
    finally:
        signals.before_task_publish.disconnect(on_publish)
    assert [r["v"] for r in result.shared["b"]["results"]] == list(range(400))
    # The first window from here: 4 processes + 1 (one waiting per process); workers send the rest as chunks finish.
    assert published.count("chordflow.run_chunk") == 4 + 1


def test_with_no_worker_registered_chunks_fall_back_and_the_run_says_so(fast_cluster: Cluster) -> None:
    assert chunking.registered_processes(fast_cluster.redis.url) == 0
    hinted = threading.Event()

    class Hint(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage() == chunking.NO_WORKER_HINT:
                hinted.set()

    handler = Hint(logging.WARNING)
    logging.getLogger("scheduler.backends.celery").addHandler(handler)
    cancelled = threading.Event()
    outcome: dict[str, Any] = {}
    wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}

    def target() -> None:
        outcome["result"] = scheduler.run(wf, {"items": [1, 2, 3]}, backend="celery", cancelled=cancelled)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        assert hinted.wait(30), "the run never said that no worker is registered"
    finally:
        cancelled.set()  # the chunks wait in the queue for a worker that never comes
        thread.join(30)
        logging.getLogger("scheduler.backends.celery").removeHandler(handler)
    assert not thread.is_alive()
    assert outcome["result"].status == "cancelled"


def test_twenty_threads_each_running_a_celery_batch_all_finish(celery_cluster: Cluster) -> None:
    """Twenty runs started at once in one process (the old worker broadcast deadlocked kombu's pool here)."""
    wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}
    start = threading.Barrier(20)
    results: dict[int, Any] = {}

    def target(n: int) -> None:
        start.wait()
        try:
            results[n] = scheduler.run(wf, {"items": [n * 100 + i for i in range(5)]}, backend="celery")
        except BaseException as exc:
            results[n] = exc

    threads = [threading.Thread(target=target, args=(n,), daemon=True) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not [t for t in threads if t.is_alive()], "some runs never finished"
    for n in range(20):
        assert not isinstance(results[n], BaseException), results[n]
        assert [r["v"] for r in results[n].shared["b"]["results"]] == [n * 100 + i for i in range(5)]


@pytest.mark.parametrize("hold", ["producers", "connections"])
def test_a_send_that_finds_the_broker_pool_busy_fails_clearly_instead_of_hanging(
    celery_cluster: Cluster, monkeypatch: pytest.MonkeyPatch, hold: str
) -> None:
    """Every wait on the broker pool is bounded (CHORDFLOW_POOL_TIMEOUT): with all of this process's producers,
    or all of its connections, held elsewhere, a submit fails after the timeout with one clear error."""
    from ir.errors import BackendError
    from scheduler import durable
    from worker.cluster.app import current_app

    monkeypatch.setenv("CHORDFLOW_POOL_TIMEOUT", "1")
    app = current_app()  # the app for these settings, with pools of its own
    pool = app.producer_pool if hold == "producers" else app.pool
    held = [pool.acquire(block=True) for _ in range(app.conf.broker_pool_limit)]
    wf = {"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]}
    try:
        started = time.monotonic()
        with pytest.raises(BackendError, match=r"^Timed out waiting for a broker (producer|connection) after 1(\.0)?s"):
            durable.submit(wf, run_id=f"busy-{hold}")
        assert durable.status(f"busy-{hold}")["status"] == "failed"  # recorded, never enqueued: not "queued"
        assert time.monotonic() - started < 30
    finally:
        for resource in held:
            resource.release()
    assert durable.wait(durable.submit(wf), timeout=60).status == "success"  # the pool serves again


def test_two_workers_started_without_a_name_on_one_host_are_two_in_the_registry(fast_cluster: Cluster) -> None:
    """Without `-n` a worker is `chordflow-<pid>@<host>` (not Celery's `celery@<host>` for both): both ways of
    starting one, side by side, count as two."""
    started = []
    for via in ("chordflow", "celery"):
        argv = fast_cluster.worker_argv(f"unnamed-{via}", via=via)
        at = argv.index("-n")
        del argv[at : at + 2]
        worker = ManagedProcess(
            argv, fast_cluster.workdir / f"worker-unnamed-{via}.log", "ready.", env=fast_cluster.env
        )
        fast_cluster.workers[f"unnamed-{via}"] = worker  # killed with the cluster
        started.append(worker)
    client = redis.Redis.from_url(fast_cluster.redis.url)
    assert heartbeat.pool_sizes(client) == {f"chordflow-{worker.pid}@{HOST}": 1 for worker in started}
