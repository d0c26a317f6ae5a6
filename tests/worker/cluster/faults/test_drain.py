"""A worker sent SIGTERM drains in seconds: its items in flight finish, those not started run elsewhere at once.

Real redis-server, real `celery` workers (solo and prefork), SIGTERM sent to the worker's main process only, as
Kubernetes sends it to a container's first process (worker/cluster/draining.py tells the pool children). Items are
`test-count` nodes (tests/support/counting_nodes.py), which record in Redis which worker started each item and
when (wall clock, one machine): the hand-back is measured from those start times, never from sleeps. The figures
are in tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import signal
import time
from pathlib import Path

import pytest

from scheduler import durable
from scheduler.localcluster import ManagedProcess
from tests.worker.cluster.faults.test_dead_workers import Counts, assert_aggregate_once, batch_workflow, default_cluster
from tests.worker.cluster.faults.test_long_chunks import until
from worker.cluster.state.runs import ClusterRuns
from worker.runs.record import FINAL

pytestmark = [pytest.mark.faults, pytest.mark.processes]

#: A SIGTERMed worker exits within this many seconds; its unstarted items begin elsewhere within HANDED_BACK.
EXITS_WITHIN, HANDED_BACK = 30, 5


def began(counts: Counts) -> dict[tuple[str, int], float]:
    """(worker, item) -> when that worker began it (wall clock)."""
    entries = counts.redis.zrange(f"{counts.key}:began", 0, -1, withscores=True)
    return {(who, int(label)): at for who, label, at in ((*e.split(" ", 1), at) for e, at in entries)}


def sigterm(worker: ManagedProcess) -> float:
    """SIGTERM to the worker's main process only; returns when (wall clock)."""
    worker.proc.send_signal(signal.SIGTERM)
    return time.time()


def exited_after(worker: ManagedProcess, since: float, timeout: float) -> float:
    worker.proc.wait(timeout=timeout)
    return time.time() - since


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_a_sigtermed_worker_hands_back_its_unstarted_items_at_once_and_exits(tmp_path: Path, pool: str) -> None:
    total = 40  # one chunk: the other worker is idle, so the hand-back is all it waits for
    workers = {name: {"pool": pool} for name in ("k1", "k2")}
    with default_cluster(tmp_path, workers) as cluster:
        counts = Counts(cluster)
        run_id = durable.submit(batch_workflow(counts, 0.5, total), {"items": list(range(total))})
        until(lambda: len(counts.runs()) >= 4, 60, "four items to start")
        victim_name = counts.runs()[0][0]
        victim = cluster.workers[victim_name]
        other = next(name for name in cluster.workers if name != victim_name)
        sent = sigterm(victim)
        exit_seconds = exited_after(victim, sent, EXITS_WITHIN + 10)
        result = durable.wait(run_id, timeout=120)
        assert_aggregate_once(result, total)
        assert set(counts.effects().values()) == {1}, counts.effects()  # each item ran once: none lost, none again
        starts_at = began(counts)
        mine = sorted(item for who, item in starts_at if who == victim_name)
        theirs = sorted(item for who, item in starts_at if who == other)
        assert mine == list(range(len(mine))) and theirs == list(range(len(mine), total)), (mine, theirs)
        handed_back = min(starts_at[(other, item)] for item in theirs) - sent
    print(f"\n{pool}: exited {exit_seconds:.2f}s after SIGTERM; ran {len(mine)} items, handed back {len(theirs)}, "
          f"the first of them began on {other} {handed_back:.2f}s after SIGTERM")  # fmt: skip
    assert exit_seconds < EXITS_WITHIN
    assert handed_back < HANDED_BACK


def auto_chunks(counts: Counts, seconds: float) -> dict:
    """`batch_workflow` with the chunk size left to the cluster (about 2 s of measured work per chunk)."""
    workflow = batch_workflow(counts, seconds, 1)
    del workflow["nodes"][0]["batch"]["chunk_size"]
    return workflow


def ended_within(run_id: str, seconds: float) -> bool:
    """Whether the run's record reads final within `seconds` (polled: its end is a record field, no event)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        record = ClusterRuns().get(run_id)
        if record is not None and record.status in FINAL:
            return True
        time.sleep(0.2)
    return False


def test_workers_sigtermed_and_replaced_every_10s_lose_and_repeat_no_item(tmp_path: Path) -> None:
    total, seconds = 5_000, 0.02
    with default_cluster(tmp_path, {name: {} for name in ("k1", "k2", "k3")}) as cluster:
        counts = Counts(cluster)
        begun = time.monotonic()
        result = durable.wait(durable.submit(auto_chunks(counts, seconds), {"items": list(range(total))}), 600)
        steady = time.monotonic() - begun
        assert_aggregate_once(result, total)

        counts = Counts(cluster)
        begun = time.monotonic()
        run_id = durable.submit(auto_chunks(counts, seconds), {"items": list(range(total))})
        exits: list[float] = []
        while not ended_within(run_id, 10):  # every 10 s the oldest worker is told to stop and a new one starts
            name = next(iter(cluster.workers))
            victim = cluster.workers.pop(name)
            sent = sigterm(victim)
            cluster.start_worker(f"k{len(exits) + 4}")  # started while the other drains, as a rolling update does
            exits.append(exited_after(victim, sent, EXITS_WITHIN + 10))
        result = durable.wait(run_id, timeout=60)
        rolling = time.monotonic() - begun
        assert_aggregate_once(result, total)
        executions = collections.Counter(counts.effects().values())
    print(f"\nrolling SIGTERM: {len(exits)} workers replaced; {rolling:.1f}s vs {steady:.1f}s steady "
          f"({rolling / steady:.2f}x); exits {min(exits):.2f}-{max(exits):.2f}s after SIGTERM; "
          f"executions per item {dict(executions)}")  # fmt: skip
    assert len(exits) >= 2
    assert max(exits) < EXITS_WITHIN
    assert executions == {1: total}, executions  # every item ran, each once
