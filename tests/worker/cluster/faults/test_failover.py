"""The state Redis fails over mid-run: Sentinel promotes the replica, and the run ends correctly or says why not.

One primary, one replica and three sentinels (tests/support/sentinel.py), all real processes; workers and this
process reach Redis through `sentinel://` URLs (broker and state), as a deployment with Sentinel does. The primary
is SIGKILLed while chunks run: each Redis command that lost its connection asks the sentinels for the new primary
and retries within the outage budget (CHORDFLOW_OUTAGE_SECONDS), and a task that could not finish gives its
message back. The run must then succeed with every index exactly once, or fail with one line saying state was lost
in the failover, within 60 s of the kill: never hang, never a wrong aggregate. Figures in tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import scheduler
from ir.errors import ReplicationLost
from scheduler import durable
from scheduler.localcluster import Cluster, RedisServer
from scheduler.ops.metrics import ClusterView
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.support.sentinel import MASTER_NAME, Sentinels, sentinel_cluster, wait_for
from tests.worker.cluster.faults.test_dead_workers import (
    Counts,
    assert_aggregate_once,
    batch_workflow,
    record_rows,
    record_workflow,
)
from tests.worker.cluster.faults.test_long_chunks import until
from worker import settings
from worker.cluster.state import connection
from worker.cluster.state.runstate import RunState

#: The run ends within this many seconds of the primary's death (the issue's bound).
WITHIN = 60


@pytest.fixture
@starts("faults")
def failover(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cluster, Sentinels, Counts]]:
    with sentinel_cluster(tmp_path, f"{PLUGINS},tests.support.counting_nodes") as (cluster, sentinels):
        previous = cluster.apply_env()
        monkeypatch.setenv("CHORDFLOW_REDIS_MASTER_NAME", MASTER_NAME)
        try:
            for name in ("k1", "k2"):
                cluster.start_worker(name)
            counts = Counts(cluster)
            counts.redis = connection.open_client(sentinels.url, decode_responses=True)  # follows the failover
            yield cluster, sentinels, counts
        finally:
            cluster.restore_env(previous)


def kill_primary(cluster: Cluster, sentinels: Sentinels, counts: Counts, started: int) -> float:
    """SIGKILL the primary once `started` items have started; the moment it died."""
    until(lambda: len(counts.runs()) >= started, 60, f"{started} items to start")
    old = sentinels.primary_port()
    cluster.redis.kill()
    killed = time.monotonic()
    until(lambda: sentinels.primary_port() != old, 30, "the sentinels to promote the replica")
    print(f"\nreplica promoted {time.monotonic() - killed:.1f}s after the primary's SIGKILL")
    return killed


def assert_once_or_lost(effects: dict[int, int], total: int) -> None:
    """Every index ran; none more than twice (a chunk in flight at the kill may run again, not its outcome)."""
    assert set(effects) == set(range(total)), sorted(set(range(total)) - set(effects))
    assert max(effects.values()) <= 2, effects


def test_a_primary_killed_mid_batch_fails_over_and_the_run_completes_once(
    failover: tuple[Cluster, Sentinels, Counts],
) -> None:
    cluster, sentinels, counts = failover
    total, chunk_size = 40, 5
    run_id = durable.submit(batch_workflow(counts, 0.2, chunk_size), {"items": list(range(total))})
    killed = kill_primary(cluster, sentinels, counts, started=8)
    result = durable.wait(run_id, timeout=WITHIN + 30)
    seconds = time.monotonic() - killed
    assert seconds < WITHIN, f"the run ended {seconds:.1f}s after the primary's death"
    assert_aggregate_once(result, total)
    effects = counts.effects()
    assert_once_or_lost(effects, total)
    seen = ClusterView().snapshot()  # the metrics' own clients, broker and state, find the new primary too
    assert {host.split("@", 1)[0] for host in seen.workers} == {"k1", "k2"}
    assert sum(n for (status, _), n in seen.runs.items() if status == "succeeded") == 1, seen.runs
    print(f"primary killed mid-batch: run ended {seconds:.1f}s after the kill; side effects per index: "
          f"{dict(collections.Counter(effects.values()))}")  # fmt: skip


def test_a_primary_killed_mid_dataset_job_fails_over_and_the_job_completes_once(
    failover: tuple[Cluster, Sentinels, Counts],
) -> None:
    cluster, sentinels, counts = failover
    total, chunk_size = 60, 10
    run_id = scheduler.submit(
        record_workflow(counts, 0.1), items=({"n": i} for i in range(total)), chunk_size=chunk_size
    )
    killed = kill_primary(cluster, sentinels, counts, started=12)
    result = scheduler.wait(run_id, timeout=WITHIN + 30)
    seconds = time.monotonic() - killed
    assert seconds < WITHIN, f"the job ended {seconds:.1f}s after the primary's death"
    assert result.status == "success" and result.outputs == {"total": total, "done": total, "failed": 0}, result
    rows = record_rows(run_id)
    assert [(r["index"], r["result"]["label"]) for r in rows] == [(i, str(i)) for i in range(total)]  # one each
    effects = counts.effects()
    assert_once_or_lost(effects, total)
    print(f"primary killed mid-dataset-job: job ended {seconds:.1f}s after the kill; side effects per record: "
          f"{dict(collections.Counter(effects.values()))}")  # fmt: skip


def test_a_sentinel_url_names_its_sentinels_and_the_primarys_db_and_password() -> None:
    url = "sentinel://:pw@10.0.0.1:26379/2;sentinel://10.0.0.2:26380/2;sentinel://10.0.0.3"
    assert connection.is_sentinel(url) and not connection.is_sentinel("redis://10.0.0.1:6379/0")
    addresses, params = connection.sentinel_addresses(url)
    assert addresses == [("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)]
    assert params == {"db": 2, "password": "pw"}


def test_a_sentinel_url_without_a_master_name_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380")
    monkeypatch.delenv("CHORDFLOW_REDIS_MASTER_NAME", raising=False)
    with pytest.raises(ValueError, match="needs CHORDFLOW_REDIS_MASTER_NAME") as raised:
        settings.load()
    assert "\n" not in str(raised.value)
    monkeypatch.setenv("CHORDFLOW_REDIS_MASTER_NAME", "mymaster")
    assert settings.load().redis_master_name == "mymaster"


@pytest.mark.processes
def test_with_wait_replicas_a_failover_that_took_the_only_replica_fails_the_run_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CHORDFLOW_WAIT_REPLICAS=1: outcomes count once the replica holds them. The failover promotes the only
    replica, so no later outcome can be replicated: the run fails, saying so, instead of hanging or counting
    outcomes a second failover could lose."""
    monkeypatch.setenv("CHORDFLOW_WAIT_REPLICAS", "1")
    with sentinel_cluster(tmp_path, f"{PLUGINS},tests.support.counting_nodes") as (cluster, sentinels):
        cluster.env["CHORDFLOW_WAIT_REPLICAS"] = "1"
        previous = cluster.apply_env()
        monkeypatch.setenv("CHORDFLOW_REDIS_MASTER_NAME", MASTER_NAME)
        try:
            cluster.start_worker("k1")
            counts = Counts(cluster)
            counts.redis = connection.open_client(sentinels.url, decode_responses=True)
            total, chunk_size = 40, 5
            run_id = durable.submit(batch_workflow(counts, 0.2, chunk_size), {"items": list(range(total))})
            killed = kill_primary(cluster, sentinels, counts, started=8)
            result = durable.wait(run_id, timeout=WITHIN + 30)
            seconds = time.monotonic() - killed
        finally:
            cluster.restore_env(previous)
    assert seconds < WITHIN, f"the run ended {seconds:.1f}s after the primary's death"
    assert result.status == "failed", result
    assert "state may be lost in a Redis failover" in result.error and "\n" not in result.error, result.error
    print(f"primary killed with CHORDFLOW_WAIT_REPLICAS=1: run failed {seconds:.1f}s after the kill: {result.error}")


@pytest.mark.processes
def test_wait_replicas_holds_a_chunks_outcomes_until_the_replica_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The WAIT runs on the connection that wrote (a WAIT on another pooled connection would count nothing): with
    the replica stopped (SIGSTOP) a chunk's publish fails with ReplicationLost and aborts its batch; resumed, the
    same publish succeeds once the replica holds it."""
    primary = RedisServer(tmp_path)
    replica = RedisServer(tmp_path, ["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        wait_for(lambda: redis.Redis(port=replica.port).info("replication")["master_link_status"] == "up", 30, "sync")
        monkeypatch.setenv("CHORDFLOW_WAIT_REPLICAS", "1")
        state = RunState("waitrun", redis.Redis.from_url(primary.url))
        state.publish("b#0", [(0, True)])  # the replica answers: done
        replica.kill(signal.SIGSTOP)
        with pytest.raises(ReplicationLost, match="0 of 1 replicas"):
            state.publish("b#0", [(1, True)])
        assert state.should_stop("b#0")  # the batch's other chunks stop between items
        replica.kill(signal.SIGCONT)
        state.publish("b#1", [(2, True)])
        replicated = redis.Redis(port=replica.port)
        assert replicated.xlen(state.keys.events) == 3  # the stopped publish's write reached the replica later
    finally:
        replica.kill(signal.SIGCONT)
        replica.kill()
        primary.kill()
