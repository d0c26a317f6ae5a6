"""A worker host cut off from Redis past the outage budget gives its work back; the run does not fail.

The worker runs in a network namespace of its own (tests/support/netns.py) and reaches the suite's
redis-server over a veth link. Cutting the link mid-chunk for longer than CHORDFLOW_OUTAGE_SECONDS (set short
here) makes the worker's Redis commands fail after that budget. Its task gives the chunk back
(worker/cluster/outage.py) instead of recording a failure, and runs it again once the link is back: the run
succeeds. Before, the failure was stored as soon as Redis could be reached and failed the run at once (no
other worker had swept the delivery yet: the dead-delivery bound is the default 30 s). When another worker
sweeps the delivery first, the fencing of tests/worker/cluster/faults/test_dead_workers.py drops the cut worker's
outcome instead.
Figures in tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import durable
from scheduler.localcluster import Cluster, ManagedProcess
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.support.netns import FarHost, far_host
from tests.worker.cluster.faults.test_dead_workers import (
    Counts,
    assert_aggregate_once,
    batch_workflow,
    chunk_of,
    log_lines,
)
from tests.worker.cluster.faults.test_long_chunks import until

#: The far worker's outage budget: Redis out of reach longer than this and its task gives its message back.
BUDGET = 3
GIVEN_BACK = "given back, to be delivered again"


@contextlib.contextmanager
def split_cluster(workdir: Path) -> Iterator[tuple[Cluster, FarHost]]:
    """A redis-server on this host (default settings) and one worker, `far`, on a far host; this process points
    at the cluster meanwhile."""
    with far_host() as far:
        cluster = Cluster(
            workdir,
            plugins=f"{PLUGINS},tests.support.counting_nodes",
            redis_args=["--bind", "127.0.0.1", far.gateway, "--protected-mode", "no"],  # a private link
        )
        previous = cluster.apply_env()
        try:
            url = f"redis://{far.gateway}:{cluster.redis.port}/0"
            env = {**cluster.env, "CHORDFLOW_BROKER_URL": url, "CHORDFLOW_RESULT_BACKEND": url}
            env["CHORDFLOW_OUTAGE_SECONDS"] = str(BUDGET)
            argv = far.argv(cluster.worker_argv("far"))
            cluster.workers["far"] = ManagedProcess(argv, workdir / "worker-far.log", "ready.", env=env)
            yield cluster, far
        finally:
            far.restore()
            cluster.restore_env(previous)
            cluster.stop()


@pytest.fixture
@starts("faults")
def split(tmp_path: Path) -> Iterator[tuple[Cluster, FarHost]]:
    with split_cluster(tmp_path) as made:
        yield made


def test_a_worker_cut_off_past_the_outage_budget_gives_its_chunk_back(split: tuple[Cluster, FarHost]) -> None:
    cluster, far = split
    total, chunk_size = 20, 5
    counts = Counts(cluster)
    run_id = durable.submit(batch_workflow(counts, 0.5, chunk_size), {"items": list(range(total))})
    until(lambda: len(counts.started_by("far")) >= 2, 60, "the far worker to run items")
    far.cut()
    cut_at = time.monotonic()
    lost = chunk_of(counts, "far", chunk_size)
    until(lambda: log_lines(cluster, GIVEN_BACK), 60, "the far worker to give its chunk back")
    given_back = time.monotonic() - cut_at
    # Its give-back cannot reach the broker either: the worker lets the delivery go, so that once the link is back a
    # sweeper puts the chunk back (it used to keep renewing it forever, the run stuck).
    until(lambda: log_lines(cluster, "Couldn't reject"), 60, "the far worker's give-back to fail while cut off")
    far.restore()  # past the budget: without the give-back, the chunk's failure would be stored now
    result = durable.wait(run_id, timeout=120)
    ended = time.monotonic() - cut_at
    assert_aggregate_once(result, total)
    assert [line for line in log_lines(cluster, GIVEN_BACK) if "chordflow.run_chunk[" in line]
    effects = counts.effects()
    assert set(effects) == set(range(total))  # every item ran (at least once)
    twice = sorted(i for i, n in effects.items() if n > 1)
    assert max(effects.values()) <= 2 and set(twice) <= set(lost), (twice, lost)  # only the cut chunk's, again
    print(f"\nnetwork cut past the budget mid-chunk: given back {given_back:.1f}s after the cut, run ended "
          f"{ended:.1f}s after it; side effects per index: {dict(collections.Counter(effects.values()))} "
          f"(ran twice: {twice})")  # fmt: skip


def test_a_worker_cut_off_past_the_outage_budget_gives_its_plain_node_back(split: tuple[Cluster, FarHost]) -> None:
    """The same during a plain node (an `advance` task): the run is not marked failed; the node in flight is
    the only one that may run twice."""
    cluster, far = split
    counts = Counts(cluster)
    node = {"type": "test-count", "params": {"key": counts.key, "seconds": 0.2}}
    steps = [{**node, "id": f"n{i}", "params": {**node["params"], "label": i}} for i in range(3)]
    steps[1]["params"]["seconds"] = 5  # the node the cut lands in
    workflow = {"nodes": steps, "edges": [{"from": "n0", "to": "n1"}, {"from": "n1", "to": "n2"}]}
    run_id = durable.submit(workflow, {})
    until(lambda: 1 in counts.started_by("far"), 60, "the far worker to start node n1")
    far.cut()
    cut_at = time.monotonic()
    until(lambda: log_lines(cluster, GIVEN_BACK, "chordflow.advance"), 60, "the far worker to give its advance back")
    far.restore()
    result = durable.wait(run_id, timeout=120)
    assert result.status == "success", result.error
    effects = counts.effects()
    assert effects[0] == 1 and effects[2] == 1 and 1 <= effects[1] <= 2, effects  # only n1 may run again
    print(f"\nnetwork cut past the budget mid-node: run ended {time.monotonic() - cut_at:.1f}s after the cut; "
          f"side effects per node: {effects}")  # fmt: skip
