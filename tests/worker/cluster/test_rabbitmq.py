"""RabbitMQ as the broker (worker/cluster/broker/amqp.py): what only it has. Each test's cluster is on a vhost of
its own on the machine's RabbitMQ (tests/support/rabbitmq.py), with its own redis-server for the run state and
real `celery` workers. The suite's broker-dependent cluster tests run on both brokers through the `broker` fixture.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection
from rich.console import Console

from scheduler import durable
from scheduler.localcluster import Cluster, ManagedProcess, free_port
from scheduler.ops import top
from scheduler.ops.metrics import ClusterView
from tests.support import (
    counting_nodes,  # noqa: F401  (the test node type, in this process too)
    rabbitmq,
)
from tests.support.cluster import PLUGINS
from tests.support.netns import far_host, relay
from tests.worker.cluster.faults.test_dead_workers import Counts, assert_aggregate_once, batch_workflow, chunk_of
from tests.worker.cluster.faults.test_long_chunks import until
from tests.worker.cluster.test_fairness import AGING_ENV, low_run_behind_endless_higher_work
from tests.worker.cluster.test_signing import RUN_CHUNK, chunk_job
from worker import settings
from worker.cluster import priorities
from worker.cluster.app import current_app
from worker.cluster.broker.registry import for_settings as broker_for

IDLE_QUEUE = "rabbit-idle"  # no worker consumes it: what is sent there waits


@contextlib.contextmanager
def own_cluster(workdir: Path, workers: int = 2, pool: str = "threads", **env: str) -> Iterator[Cluster]:
    """A cluster on a fresh vhost, `workers` one-process workers (`pool`: threads, as a solo worker on RabbitMQ
    stalls up to a second between chunks) with `env` added; this process points at it meanwhile."""
    workdir.mkdir(parents=True, exist_ok=True)
    with rabbitmq.vhost() as url:
        cluster = Cluster(workdir, plugins=PLUGINS, broker_url=url)
        cluster.env.update(env)
        previous = cluster.apply_env()
        try:
            for n in range(1, workers + 1):
                cluster.start_worker(f"r{n}", pool=pool)
            yield cluster
        finally:
            cluster.restore_env(previous)
            cluster.stop()


def chunks_in(log: Path, word: str) -> list[str]:
    """Ids of the chunk tasks a worker's log says were `received` or `succeeded`."""
    return re.findall(rf"Task {re.escape(RUN_CHUNK)}\[([0-9a-f-]+)\] {word}", log.read_text())


def side_effects(log: Path, node: str, seconds: float, chunk_size: int) -> dict[str, Any]:
    """A batch node `node` over `${items}` whose items append their value to `log` after `seconds`."""
    params = {"log": str(log), "label": "${item}", "seconds": seconds}
    batch = {"items": "${items}", "chunk_size": chunk_size}
    return {"nodes": [{"id": node, "type": "test-side-effect", "params": params, "batch": batch}]}


@pytest.mark.processes
def test_a_sigkilled_workers_chunk_runs_again_within_seconds_and_the_run_ends_within_30s(tmp_path: Path) -> None:
    total, log = 60, tmp_path / "effects"
    with own_cluster(tmp_path) as cluster:
        run_id = durable.submit(side_effects(log, "b", 0.2, 6), {"items": list(range(total))})
        r1, r2 = cluster.workers["r1"], cluster.workers["r2"]
        held = until(
            lambda: set(chunks_in(r1.log, "received")) - set(chunks_in(r1.log, "succeeded")),
            60,
            "r1 to be running a chunk",
        )
        r1.kill(signal.SIGKILL)  # its connection closes: RabbitMQ puts its unacknowledged chunk back at once
        killed = time.monotonic()
        (chunk,) = held
        until(lambda: chunk in chunks_in(r2.log, "received"), 10, "the killed worker's chunk to reach r2")
        again = time.monotonic() - killed
        result = durable.wait(run_id, timeout=30)
        ended = time.monotonic() - killed
    assert result.status == "success"
    assert again < 10 and ended < 30, (again, ended)
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"]) == (total, total)
    assert [r["label"] for r in aggregate["results"]] == [str(i) for i in range(total)]  # each once, in order
    ran = log.read_text().split()
    assert set(ran) == {str(i) for i in range(total)}  # every item ran, the killed chunk's again


@pytest.mark.processes
def test_a_solo_workers_chunk_longer_than_two_heartbeats_is_delivered_once(tmp_path: Path) -> None:
    """A `-P solo` worker's consumer loop sends no heartbeat while it runs a chunk: without the worker's own
    heartbeats (SoloHeartbeats) RabbitMQ drops its connection after two silent intervals (here 4 s) and the
    chunk is delivered again."""
    log = tmp_path / "effects"
    with own_cluster(tmp_path, workers=1, pool="solo", CHORDFLOW_BROKER_HEARTBEAT="2") as cluster:
        run_id = durable.submit(side_effects(log, "b", 4.0, 3), {"items": [0, 1, 2]})  # one 12 s chunk
        result = durable.wait(run_id, timeout=60)
        received = chunks_in(cluster.workers["r1"].log, "received")
        worker_log = cluster.workers["r1"].log.read_text()
    assert result.status == "success"
    assert log.read_text().split() == ["0", "1", "2"]  # each item once
    assert len(received) == len(set(received)) == 1, received
    assert "missed heartbeats" not in worker_log and "Connection to broker lost" not in worker_log


@pytest.mark.processes
def test_the_queue_is_declared_for_priorities_or_as_a_quorum_queue(tmp_path: Path) -> None:
    """Classic: `x-max-priority`, so message priorities work. Quorum (CHORDFLOW_QUEUE_TYPE=quorum): replicated,
    no priorities; Celery prefetches per consumer there (no global QoS) and sends countdowns through RabbitMQ's
    delayed-delivery exchanges. Durable runs work on both."""
    with own_cluster(tmp_path / "classic", workers=1) as classic:
        classic_run = durable.wait(durable.submit(side_effects(tmp_path / "c", "b", 0, 2), {"items": [0, 1, 2, 3]}), 60)
        classic_queue = queue_row(classic)
    with own_cluster(tmp_path / "quorum", workers=1, CHORDFLOW_QUEUE_TYPE="quorum") as quorum:
        result = durable.wait(durable.submit(side_effects(tmp_path / "q", "b", 0, 2), {"items": [0, 1, 2, 3]}), 60)
        quorum_queue = queue_row(quorum)
        # A countdown (an advance waiting out a dead holder's lease) goes through native delayed delivery there.
        later = current_app().send_task("tests.add", (1, 2), countdown=2)
        quorum.workers["r1"].wait_for_line(f"tests.add[{later.id}] succeeded", 60)
    assert classic_run.status == "success" and classic_run.shared["b"]["count"] == 4
    assert result.status == "success" and result.shared["b"]["count"] == 4
    assert classic_queue["type"] == "classic" and "x-max-priority" in classic_queue["arguments"]
    assert quorum_queue["type"] == "quorum" and "x-max-priority" not in quorum_queue["arguments"]


def queue_row(cluster: Cluster) -> dict[str, str]:
    """`rabbitmqctl list_queues` of chordflow's queue in the cluster's vhost."""
    vhost = cluster.env["CHORDFLOW_BROKER_URL"].rsplit("/", 1)[1]
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "type", "arguments", "--no-table-headers"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    for line in out.splitlines():
        name, kind, arguments = line.split("\t", 2)
        if name == settings.load().queue:
            return {"type": kind, "arguments": arguments}
    raise AssertionError(f"no queue {settings.load().queue} in {out!r}")


@pytest.mark.processes
def test_metrics_and_top_read_a_queues_depth_and_its_next_messages_age_from_rabbitmq(tmp_path: Path) -> None:
    wf = {"name": "rabbit-idle", "nodes": [{"id": "a", "type": "echo", "params": {"v": 1}}]}
    with own_cluster(tmp_path, workers=1) as cluster:
        view = ClusterView(queues=["chordflow", IDLE_QUEUE])
        sent = time.time()
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("CHORDFLOW_QUEUE", IDLE_QUEUE)
            run_id = durable.submit(wf)
        first = {q.name: q for q in view.snapshot().queues}
        assert first[IDLE_QUEUE].messages == 1  # its first advance, waiting
        age = first[IDLE_QUEUE].oldest_age
        assert age is not None and 0 <= age <= time.time() - sent
        later = until(
            lambda: (q := {q.name: q for q in view.snapshot().queues})[IDLE_QUEUE].oldest_age >= age + 0.5 and q,
            30,
            "the waiting message to grow older",
        )
        assert later[IDLE_QUEUE].messages == 1  # reading the age left it waiting, in place
        assert later["chordflow"].messages == 0 and later["chordflow"].oldest_age is None
        screen = Console(width=300, record=True, file=io.StringIO())
        screen.print(top.render(view.snapshot(), top.Rates(), "rabbitmq"))  # what `chordflow top` shows
        text = screen.export_text()
        assert f"queue {IDLE_QUEUE}: 1 waiting (oldest " in text and "chunks in flight ?" in text, text
        durable.cancel_run(run_id)
        assert cluster.workers["r1"].proc.poll() is None


@pytest.mark.processes
def test_a_forged_chunk_sent_through_rabbitmq_is_dropped_and_never_runs(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    task_id = uuid.uuid4().hex
    with own_cluster(tmp_path, workers=1) as cluster:
        forger = Celery("forger", set_as_current=False)
        options = broker_for(settings.load()).app_options()
        forger.conf.update(broker_url=cluster.env["CHORDFLOW_BROKER_URL"], task_serializer="msgpack",
                           task_queues=options["task_queues"], task_default_queue=settings.load().queue)  # fmt: skip
        try:
            forger.send_task(RUN_CHUNK, (chunk_job(f"touch {pwned}"),), task_id=task_id)
        finally:
            forger.close()
        line = cluster.workers["r1"].wait_for_line(f"dropped task {RUN_CHUNK}[{task_id}]", 60)
    assert "WARNING" in line and "no valid signature" in line
    assert not pwned.exists()


def test_rabbitmq_settings_are_checked_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", rabbitmq.SERVER + "/")
    monkeypatch.delenv("CHORDFLOW_RESULT_BACKEND", raising=False)
    with pytest.raises(ValueError, match=r"^CHORDFLOW_RESULT_BACKEND must name a Redis server when") as missing:
        settings.load()
    assert "\n" not in str(missing.value)
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", "redis://127.0.0.1:6379/0")
    monkeypatch.setenv("CHORDFLOW_QUEUE_TYPE", "stream")
    with pytest.raises(ValueError, match=r"^CHORDFLOW_QUEUE_TYPE must be 'classic' or 'quorum', got 'stream'$"):
        settings.load()
    monkeypatch.setenv("CHORDFLOW_QUEUE_TYPE", "Quorum")
    monkeypatch.setenv("CHORDFLOW_BROKER_HEARTBEAT", "4")
    options = broker_for(settings.load()).app_options()
    assert options["broker_heartbeat"] == 4
    assert options["task_queues"][0].queue_arguments["x-queue-type"] == "quorum"


@pytest.mark.processes
def test_a_worker_host_cut_off_for_good_has_its_chunk_back_within_the_heartbeat_bound(tmp_path: Path) -> None:
    """The far worker runs in a network namespace of its own (tests/support/netns.py) and reaches RabbitMQ through
    a relay on this host (socat: RabbitMQ listens on loopback only) and Redis over the link. Once the link is cut
    its TCP connections hang half-open: RabbitMQ hears no heartbeat (CHORDFLOW_BROKER_HEARTBEAT, the default
    10 s), closes the connection after two silent intervals and puts the chunk back; the near worker runs it."""
    total, chunk_size = 20, 5
    with rabbitmq.vhost() as url, far_host() as far, relay(far, 5672, listen=free_port()) as broker:
        cluster = Cluster(
            tmp_path,
            plugins=f"{PLUGINS},tests.support.counting_nodes",
            broker_url=url,
            redis_args=["--bind", "127.0.0.1", far.gateway, "--protected-mode", "no"],  # a private link
        )
        previous = cluster.apply_env()
        try:
            far_env = {
                **cluster.env,
                "CHORDFLOW_BROKER_URL": url.replace("127.0.0.1:5672", broker),
                "CHORDFLOW_RESULT_BACKEND": f"redis://{far.gateway}:{cluster.redis.port}/0",
            }
            argv = far.argv(cluster.worker_argv("far", pool="threads"))
            cluster.workers["far"] = ManagedProcess(argv, tmp_path / "worker-far.log", "ready.", env=far_env)
            cluster.start_worker("near", pool="threads")
            counts = Counts(cluster)
            run_id = durable.submit(batch_workflow(counts, 0.5, chunk_size), {"items": list(range(total))})
            until(lambda: len(counts.started_by("far")) >= 2, 60, "the far worker to run items")
            far.cut()  # for good
            cut_at = time.monotonic()
            lost = chunk_of(counts, "far", chunk_size)
            until(lambda: lost[0] in counts.started_by("near"), 60, "the cut-off worker's chunk to reach `near`")
            back = time.monotonic() - cut_at
            result = durable.wait(run_id, timeout=90)
            ended = time.monotonic() - cut_at
            effects = counts.effects()
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    assert_aggregate_once(result, total)
    assert 15 <= back <= 45, back  # two to three 10 s heartbeat intervals, plus the worker's last item
    assert ended <= 90, ended
    assert set(effects) == set(range(total))
    assert {i for i, n in effects.items() if n > 1} <= set(lost)  # only the cut chunk's items ran twice
    print(f"\nRabbitMQ, a worker host cut off for good mid-chunk: its chunk started again {back:.1f}s after the cut,"
          f" the run ended {ended:.1f}s after it")  # fmt: skip


@pytest.mark.processes
def test_a_run_with_nothing_at_the_amqp_broker_url_fails_at_once_with_one_line(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(side_effects(tmp_path / "log", "b", 0, 1)))
    env = {
        **os.environ,
        "CHORDFLOW_BROKER_URL": f"amqp://guest:s3cret@127.0.0.1:{port}//",
        "CHORDFLOW_RESULT_BACKEND": f"redis://127.0.0.1:{free_port()}/0",
        "CHORDFLOW_SECRET_KEY": secrets.token_hex(32),
    }
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--input", "items=[1,2]", "--backend", "celery"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: cannot reach the broker at amqp://guest:**@127.0.0.1:{port}// ([Errno 111] Connection refused)"
    ]


@pytest.mark.processes
def test_the_classic_queue_hands_out_higher_priority_messages_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """chordflow's queue as declared (x-max-priority): a run's `high` message overtakes `normal` and `low` ones."""
    with rabbitmq.vhost() as url:
        monkeypatch.setenv("CHORDFLOW_BROKER_URL", url)
        monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", "redis://127.0.0.1:6379/0")  # not contacted
        broker = broker_for(settings.load())
        with Connection(url) as conn:
            queue = broker.app_options()["task_queues"][0](conn)
            queue.declare()
            producer = conn.Producer()
            for level in ("low", "normal", "high"):
                producer.publish(level, exchange=queue.exchange, routing_key=queue.routing_key,
                                 priority=priorities.message_priority(url, level, priorities.CHUNK))  # fmt: skip
            taken = [queue.get(no_ack=True).payload for _ in range(3)]
    assert taken == ["high", "normal", "low"]


@pytest.mark.processes
def test_a_low_run_behind_endless_higher_work_is_sent_again_higher_and_finishes(tmp_path: Path) -> None:
    with own_cluster(tmp_path / "cluster", **AGING_ENV):  # x-max-priority: strict too, so aging copies
        low_run_behind_endless_higher_work(tmp_path)
