"""The workers the queued work can keep busy (`chordflow_desired_pool_slots`, `chordflow_desired_workers`: what KEDA
scales on), scraped over HTTP from a real `chordflow metrics` while real workers run the batches: an idle cluster
asks for 0 and a submitted run for 1 from zero; 40 queued one-item chunks for 40 slots; `max_concurrent` caps it
(3; 1 for a parallel batch whose threads hold every permit); 10 requests/s of 0.15 s calls for 2 slots.

The cluster starts with no worker (`--worker-slots 2` says what one would bring); the first test scales it from
zero. Batches are held by a gate (a file their items wait for), so the chunks a scrape sees are known exactly once
the batch is planned; the rate-limited one is scraped once its bucket has measured how long a call runs.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from scheduler import durable
from scheduler.localcluster import Cluster, ManagedProcess, free_port
from tests.scheduler.ops.test_metrics import scrape, value
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker.cluster.state.keys import RunKeys, limit_key

#: Pool processes of the one worker (and what `--worker-slots` tells the metrics before it registers).
SLOTS = 2
#: Items of each gated batch, one chunk each.
ITEMS = 40


class Scaling:
    def __init__(self, cluster: Cluster, port: int):
        self.cluster, self.port = cluster, port
        self.redis = redis.Redis.from_url(cluster.redis.url)

    def desired(self) -> tuple[float | None, float | None]:
        """(pool slots, workers) as one scrape of the metrics endpoint says."""
        samples = scrape(self.port)
        assert value(samples, "chordflow_up") == 1
        return value(samples, "chordflow_desired_pool_slots"), value(samples, "chordflow_desired_workers")

    def worker(self) -> None:
        """The one prefork worker, started the first time a test needs it."""
        if "w1" not in self.cluster.workers:
            self.cluster.start_worker("w1", via="chordflow", pool="prefork", concurrency=SLOTS)

    def until(self, condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        """Poll Redis for `condition` (a state the workers write, with a deadline); returns what it returned."""
        deadline = time.monotonic() + timeout
        while not (found := condition()):
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
            time.sleep(0.05)
        return found

    def planned(self, run_id: str) -> str:
        """Wait until the run's batch is planned (its window stored); returns the batch key."""

        def batch() -> str | None:
            for key in self.redis.hkeys(RunKeys(run_id).totals):
                if self.redis.hexists(RunKeys(run_id).window(key.decode()).plan, "id"):
                    return key.decode()
            return None

        return self.until(batch, f"run {run_id}'s batch to be planned")


@pytest.fixture(scope="module")
@starts("cluster")
def scaling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaling]:
    workdir = tmp_path_factory.mktemp("scaling")
    cluster = Cluster(workdir, plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        port = free_port()
        argv = [sys.executable, "-m", "scheduler.cli", "metrics", "--port", str(port), "--worker-slots", str(SLOTS)]
        log = workdir / "metrics.log"
        cluster.workers["metrics"] = ManagedProcess(argv, log, "serving metrics on", env=cluster.env)
        yield Scaling(cluster, port)
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def gated(tmp_path: Path, name: str, **batch: Any) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """A batch of ITEMS items, one per chunk unless `batch` says, each waiting for the file `gate`."""
    gate = tmp_path / "gate"
    params = {"log": str(tmp_path / "log"), "label": "${item}", "gate": str(gate)}
    node = {"id": "b", "type": "test-side-effect", "params": params,
            "batch": {"items": "${items}", "chunk_size": 1, **batch}}  # fmt: skip
    return {"name": name, "nodes": [node]}, {"items": list(range(ITEMS))}, gate


def test_an_idle_cluster_asks_for_none_and_work_asks_from_zero(scaling: Scaling, tmp_path: Path) -> None:
    if "w1" in scaling.cluster.workers:
        pytest.fail("this test scales from zero: run it before any test that starts the worker")
    assert scaling.desired() == (0, 0)  # nothing to run, no worker registered

    wf = {"name": "from-zero", "nodes": [{"id": "a", "type": "echo", "params": {"v": 1}}]}
    run_id = scheduler.submit(wf)
    # Its first advance waits in the queue: one slot, one worker of --worker-slots 2.
    assert scaling.desired() == (1, 1)

    scaling.worker()
    assert scheduler.wait(run_id, timeout=60).status == "success"
    assert scaling.desired() == (0, 0)  # idle again, with a worker registered


def test_a_queued_batch_without_limits_asks_for_a_slot_per_chunk(scaling: Scaling, tmp_path: Path) -> None:
    scaling.worker()
    wf, inputs, gate = gated(tmp_path, "unlimited")
    run_id = scheduler.submit(wf, inputs)
    scaling.planned(run_id)
    # 3 chunks in flight (2 running, 1 queued) + 37 blocks to do, of one item each: every chunk a slot.
    assert scaling.desired() == (ITEMS, ITEMS / SLOTS)

    gate.write_text("open")
    assert scheduler.wait(run_id, timeout=120).status == "success"
    assert scaling.desired() == (0, 0)


@pytest.mark.parametrize(
    ("batch", "slots"),
    [({"max_concurrent": 3}, 3), ({"max_concurrent": 4, "parallel": True, "chunk_size": 4}, 1)],
    ids=["sequential", "parallel"],
)
def test_a_batch_with_max_concurrent_asks_for_no_more(
    scaling: Scaling, tmp_path: Path, batch: dict[str, Any], slots: int
) -> None:
    scaling.worker()
    wf, inputs, gate = gated(tmp_path, "capped", **batch)
    run_id = scheduler.submit(wf, inputs)
    scaling.planned(run_id)
    # Sequential: 3 permits, one item per chunk. Parallel: a chunk's 4 threads hold all 4 permits.
    assert scaling.desired() == (slots, math.ceil(slots / SLOTS))

    gate.write_text("open")
    assert scheduler.wait(run_id, timeout=120).status == "success"


def test_a_batch_behind_a_rate_limit_asks_for_what_the_rate_keeps_busy(scaling: Scaling) -> None:
    scaling.worker()
    key = "desired-10-per-second"
    wf = {
        "name": "rate-limited",
        "nodes": [{"id": "call", "type": "test-slow", "params": {"seconds": 0.15},
                   "rate_limit": {"key": key, "requests_per_second": 10},
                   "batch": {"items": "${items}", "chunk_size": 1}}],
    }  # fmt: skip
    run_id = scheduler.submit(wf, {"items": list(range(200))})
    try:
        scaling.until(lambda: scaling.redis.hget(limit_key(key), "call_us"), "a call to be measured")
        slots, workers = scaling.desired()
        # 10 calls/s of 0.15 s each keep 1.5 calls in flight: 2 slots (3 if the load slows a call past 0.2 s),
        # while ~200 chunks wait (without the limit: a slot each).
        assert int(scaling.redis.hget(limit_key(key), "call_us") or 0) >= 150_000
        assert slots in (2, 3) and workers == math.ceil(slots / SLOTS)
    finally:
        durable.cancel_run(run_id)
    assert scheduler.wait(run_id, timeout=120).status == "cancelled"
    assert scaling.desired() == (0, 0)
