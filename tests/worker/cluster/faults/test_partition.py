"""A network partition between worker hosts and the Redis host, for 30 s and for good.

Redis runs on this host behind a bridge (tests/support/netns.py `lan`); two workers, `a` and `b`, each run on a host
of their own (a network namespace with its own link to the bridge), the scheduler here. Mid-batch, `b`'s link goes
down: its packets are dropped, its process lives on and its TCP connections hang, unlike a SIGKILL. Every index
must count exactly once. For good: `b`'s chunk stops being renewed and a sweep gives it to `a` after the dead-delivery
bound (worker/cluster/broker/deliveries.py), so the run succeeds within 90 s of the cut. For 30 s: `b` comes back
within its outage budget (CHORDFLOW_OUTAGE_SECONDS, 60 s) and either finishes its chunk or, if `a` took it over,
is fenced: no second outcome. Meanwhile `status` lists the workers registered: `b` drops out of it (its heartbeat
stops; the entry lives 3 beats) and comes back with its link. Figures in tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import durable
from scheduler.localcluster import Cluster, ManagedProcess
from tests.scheduler.cli.test_cli import run_cli
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.support.netns import Bridge, lan
from tests.worker.cluster.faults.test_dead_workers import Counts, assert_aggregate_once, batch_workflow, chunk_of
from tests.worker.cluster.faults.test_long_chunks import until
from worker.cluster.state import heartbeat, runstate

#: A worker's registry entry lives 3 beats: 6 s here, so `status` shows a cut-off host gone within seconds.
HEARTBEAT = 2


@pytest.fixture
@starts("faults")
def partitioned(tmp_path: Path) -> Iterator[tuple[Cluster, Bridge]]:
    """A redis-server on the bridge (and loopback) and one worker on each of two far hosts; this process points at
    the cluster meanwhile. The links, namespaces and bridge go with the fixture, also after a failure."""
    with lan(2) as bridge:
        cluster = Cluster(
            tmp_path,
            plugins=f"{PLUGINS},tests.support.counting_nodes",
            redis_args=["--bind", "127.0.0.1", bridge.address, "--protected-mode", "no"],
        )
        previous = cluster.apply_env()
        try:
            url = f"redis://{bridge.address}:{cluster.redis.port}/0"
            env = {**cluster.env, "CHORDFLOW_BROKER_URL": url, "CHORDFLOW_RESULT_BACKEND": url}
            env["CHORDFLOW_WORKER_HEARTBEAT"] = str(HEARTBEAT)
            for name, host in zip("ab", bridge.hosts, strict=True):
                argv = host.argv(cluster.worker_argv(name))
                cluster.workers[name] = ManagedProcess(argv, tmp_path / f"worker-{name}.log", "ready.", env=env)
            yield cluster, bridge
        finally:
            for host in bridge.hosts:
                host.restore()
            cluster.restore_env(previous)
            cluster.stop()


def workers_listed(run_id: str) -> set[str]:
    return {host.split("@", 1)[0] for host in durable.status(run_id).get("workers", {})}


def cut_mid_batch(cluster: Cluster, bridge: Bridge, counts: Counts) -> tuple[str, range, float]:
    """A batch running on both hosts; `b`'s link cut once `b` is inside a chunk. (run id, b's chunk, cut time)."""
    total, chunk_size = 40, 5
    run_id = durable.submit(batch_workflow(counts, 0.5, chunk_size), {"items": list(range(total))})
    until(lambda: len(counts.started_by("b")) >= 2 and counts.started_by("a"), 60, "both hosts to run items")
    bridge.hosts[1].cut()
    cut_at = time.monotonic()
    return run_id, chunk_of(counts, "b", chunk_size), cut_at


def assert_once(counts: Counts, lost: range, total: int = 40) -> list[int]:
    """Every index ran; only the cut chunk's ran again (side effects are at least once: the chunk taken over, and a
    command whose reply the cut swallowed, retried by the cut host's client when it comes back)."""
    effects = counts.effects()
    assert set(effects) == set(range(total))
    again = sorted(i for i, n in effects.items() if n > 1)
    assert set(again) <= set(lost), (again, lost)
    print(f"\nexecutions of the cut chunk's items (worker, item): {[r for r in counts.runs() if int(r[1]) in lost]}")
    return again


def test_a_worker_host_cut_off_for_good_has_its_chunk_redone_and_the_run_succeeds(
    partitioned: tuple[Cluster, Bridge],
) -> None:
    cluster, bridge = partitioned
    counts = Counts(cluster)
    run_id, lost, cut_at = cut_mid_batch(cluster, bridge, counts)
    until(lambda: workers_listed(run_id) == {"a"}, 30, "status to list only the worker still reachable")
    gone = time.monotonic() - cut_at
    shown = run_cli("status", run_id)  # what an operator sees meanwhile
    assert shown.returncode == 0, shown.stderr
    assert "workers: a@" in shown.stdout and "b@" not in shown.stdout, shown.stdout
    until(lambda: [label for who, label in counts.runs() if who == "a" and int(label) in lost], 60, "a to redo it")
    taken_over = time.monotonic() - cut_at
    result = durable.wait(run_id, timeout=90)
    ended = time.monotonic() - cut_at
    assert taken_over < 60 and ended < 90, (taken_over, ended)
    assert_aggregate_once(result, 40)
    twice = assert_once(counts, lost)
    bridge.hosts[1].restore()  # b comes back after the run ended: it may finish its chunk, never report it
    registry = runstate.client()
    until(lambda: any(h.startswith("b@") for h in heartbeat.pool_sizes(registry)), 60, "b to register again")
    assert_aggregate_once(durable.wait(run_id, timeout=10), 40)  # what b did on its return changed nothing
    print(f"\nhost cut for good mid-batch: gone from status {gone:.1f}s, chunk redone {taken_over:.1f}s, run ended "
          f"{ended:.1f}s after the cut; ran twice: {twice}")  # fmt: skip


def test_a_worker_host_cut_off_for_30_s_rejoins_without_a_second_outcome(partitioned: tuple[Cluster, Bridge]) -> None:
    cluster, bridge = partitioned
    counts = Counts(cluster)
    run_id, lost, cut_at = cut_mid_batch(cluster, bridge, counts)
    until(lambda: workers_listed(run_id) == {"a"}, 30, "status to list only the worker still reachable")
    gone = time.monotonic() - cut_at
    until(lambda: time.monotonic() - cut_at >= 30, 35, "30 s of partition")  # the cut's length is the scenario
    bridge.hosts[1].restore()
    result = durable.wait(run_id, timeout=90)
    ended = time.monotonic() - cut_at
    assert_aggregate_once(result, 40)
    twice = assert_once(counts, lost)
    print(f"\nhost cut for 30 s mid-batch: gone from status {gone:.1f}s after the cut, run ended {ended:.1f}s "
          f"after it; side effects per index: {dict(collections.Counter(counts.effects().values()))} "
          f"(ran twice: {twice})")  # fmt: skip
