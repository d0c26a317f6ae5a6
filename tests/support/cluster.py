"""Pytest fixtures for distributed tests: a real redis-server and real Celery workers (no fakes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler.localcluster import Cluster
from tests.support import rabbitmq
from tests.support.kinds import starts
from worker.cluster.state.runstate import RunState

# The workers' environment: the suite's, as it is when conftest loads this plugin — not whatever a
# monkeypatching test happens to have set when the session cluster is first started.
BASE_ENV = dict(os.environ)
PLUGINS = "tests.support.nodes,tests.support.dist_nodes"


#: CHORDFLOW_TEST_BROKER=rabbitmq: the suite's shared cluster (`celery_cluster`) has RabbitMQ as its broker, so the
#: batch acceptance tests (`backend` fixture) run on it; tests that reach into a Redis broker do not apply then.
TEST_BROKER = os.environ.get("CHORDFLOW_TEST_BROKER", "redis")


@pytest.fixture(scope="session")
@starts("cluster")
def celery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The suite's shared cluster: its own redis-server on a free port and two solo workers (on RabbitMQ, see
    TEST_BROKER: a vhost of its own and two threads workers)."""
    with rabbitmq.vhost() if TEST_BROKER == "rabbitmq" else contextlib.nullcontext() as broker_url:
        pool = "solo" if broker_url is None else "threads"
        cluster = Cluster(tmp_path_factory.mktemp("cluster"), plugins=PLUGINS, base_env=BASE_ENV, broker_url=broker_url)
        try:
            cluster.start_worker("w1", pool=pool)  # `celery -A worker.app worker`
            cluster.start_worker("w2", pool=pool, via="chordflow")  # `chordflow worker`: both ways must serve chunks
            previous = cluster.apply_env()
            yield cluster
            cluster.restore_env(previous)
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
@starts("cluster")
def rabbitmq_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The suite's cluster with RabbitMQ as the broker: a vhost of its own on the machine's RabbitMQ
    (tests/support/rabbitmq.py), its own redis-server for the run state and two solo workers. Not applied to the
    environment: the `broker` fixture points a test at it."""
    with rabbitmq.vhost() as url:
        cluster = Cluster(tmp_path_factory.mktemp("rabbitmq"), plugins=PLUGINS, base_env=BASE_ENV, broker_url=url)
        try:
            # Threads, not solo: a solo worker on RabbitMQ stalls up to a second between chunks (README: RabbitMQ).
            cluster.start_worker("a1", pool="threads")
            cluster.start_worker("a2", pool="threads", via="chordflow")
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(params=["redis", "rabbitmq"])
@starts("cluster")
def broker(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """The suite's cluster on each broker, this process pointed at it for the test: broker-dependent cluster
    tests take it instead of `celery_cluster` and run on Redis and on RabbitMQ."""
    if request.param == "redis":
        yield request.getfixturevalue("celery_cluster")
        return
    cluster = request.getfixturevalue("rabbitmq_cluster")
    previous = cluster.apply_env()
    try:
        yield cluster
    finally:
        cluster.restore_env(previous)


@contextlib.contextmanager
def sweeping_cluster(workdir: Path, visibility_timeout: int = 3600) -> Iterator[Cluster]:
    """Its own redis-server and one solo worker `k1` consuming a queue nobody sends to (it takes no chunk, but
    sweeps), aging an hour (no aging copy runs a message instead); this process points at it meanwhile."""
    cluster = Cluster(workdir, visibility_timeout=visibility_timeout, plugins=PLUGINS)
    cluster.env["CHORDFLOW_PRIORITY_AGING"] = "3600"
    previous = cluster.apply_env()
    try:
        cluster.start_worker("k1", args=("-Q", "elsewhere"))
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


@contextlib.contextmanager
def destroyable_cluster(workdir: Path, visibility_timeout: int) -> Iterator[Cluster]:
    """A cluster a test may destroy (kill workers, kill Redis): its own redis-server and two workers,
    `visibility_timeout` low so lost chunks come back quickly; this process points at it meanwhile."""
    cluster = Cluster(workdir, visibility_timeout=visibility_timeout, plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        cluster.start_worker("k1")
        cluster.start_worker("k2")
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def ctrl_c_as_in_a_terminal() -> None:
    """A child's `preexec_fn`: SIGINT's default action, as a terminal gives it. A suite started in the background by
    a shell inherits SIGINT ignored, and Python then leaves it ignored (no KeyboardInterrupt ever reaches the child)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_slow_cli_run(tmp_path: Path, env: dict[str, str], items: int = 400) -> tuple[subprocess.Popen, str]:
    """`chordflow run --backend celery` on a batch of slow items, as a subprocess; returns it and its run id
    once items are running (the run's progress stream has its first entry)."""
    wf = tmp_path / "slow.json"
    wf.write_text(
        '{"nodes": [{"id": "b", "type": "test-slow", "params": {"seconds": 0.05},'
        ' "batch": {"items": "${items}", "chunk_size": 10}}]}'
    )
    values = "[" + ",".join(str(i) for i in range(items)) + "]"
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--input", f"items={values}", "--backend", "celery"]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=ctrl_c_as_in_a_terminal
    )
    first_line = proc.stderr.readline()  # "run <id> (cancel with: ...)", printed before dispatch
    assert first_line.startswith("run "), first_line
    run_id = first_line.split()[1]
    state = RunState(run_id, redis.Redis.from_url(env["CHORDFLOW_RESULT_BACKEND"]))
    assert state.redis.xread({state.keys.events: "0-0"}, block=60_000, count=1), "no item ever ran"
    return proc, run_id
