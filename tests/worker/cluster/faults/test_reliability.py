"""Faults with real processes: a SIGKILLed worker, the broker going away. Each test has its own
cluster (redis-server + workers) because it destroys part of it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler.localcluster import Cluster
from tests.support import dist_nodes  # noqa: F401  (the test node types, in this process too)
from tests.support.cluster import PLUGINS, destroyable_cluster, start_slow_cli_run
from tests.support.kinds import starts

VISIBILITY_TIMEOUT = 6


@pytest.fixture
@starts("faults")
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with destroyable_cluster(tmp_path, VISIBILITY_TIMEOUT) as cluster:
        yield cluster


def test_sigkilled_worker_loses_and_duplicates_nothing(own_cluster: Cluster) -> None:
    total = 5000
    midway = threading.Event()
    outcome: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "batch_progress" and event["done"] >= total // 5:
            midway.set()

    def target() -> None:
        wf = {"nodes": [{"id": "b", "type": "test-slow", "params": {"seconds": 0.002}, "batch": {"items": "${items}"}}]}
        try:
            outcome["result"] = scheduler.run(wf, {"items": list(range(total))}, backend="celery", on_event=on_event)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    assert midway.wait(120), "the batch never got going"
    own_cluster.workers["k1"].kill(signal.SIGKILL)  # mid-chunk: its chunk is unacknowledged
    thread.join(VISIBILITY_TIMEOUT + 90)
    assert not thread.is_alive(), "the batch did not finish after the lost chunk's visibility timeout"
    assert "error" not in outcome, outcome.get("error")
    aggregate = outcome["result"].shared["b"]
    assert aggregate["count"] == total
    assert aggregate["success_count"] == total
    assert [r["index"] for r in aggregate["results"]] == list(range(total))  # each index exactly once, in order


def test_broker_going_away_ends_chordflow_run_with_a_clear_error(own_cluster: Cluster, tmp_path: Path) -> None:
    proc, _ = start_slow_cli_run(tmp_path, {**own_cluster.env, "CHORDFLOW_PLUGINS": PLUGINS})
    own_cluster.redis.kill(signal.SIGKILL)  # items are running: the broker dies under the run
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "lost the connection to Redis" in err
    assert "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
