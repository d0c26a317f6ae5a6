"""Durable waits on a real cluster (worker/cluster/waits.py): a waiting run holds no worker, its timer fires from
Redis whatever dies meanwhile, `chordflow signal` releases an event's wait, a cancel reaches a run that waits.

One worker with one solo process serves every run here: 200 waiting runs and a batch running its items beside
them only work if waiting takes no slot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler import api
from scheduler.localcluster import Cluster
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from worker.cluster.state.keys import TIMERS
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import client

#: Runs waiting at once.
WAITERS = 200


@pytest.fixture(scope="module")
@starts("cluster")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A redis-server of its own and ONE worker with one solo process; this process points at it."""
    cluster = Cluster(tmp_path_factory.mktemp("waits"), plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        cluster.start_worker("t1")
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def waiting_then_echo(**params: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {"id": "w", "type": "wait", "params": params},
            {"id": "e", "type": "echo", "params": {"got": "${w}"}},
        ],
        "edges": [{"from": "w", "to": "e"}],
    }


def shown_waiting(run_id: str, timeout: float = 60) -> dict[str, Any]:
    """The run's `waiting` status once it shows one."""
    deadline = time.monotonic() + timeout
    while "waiting" not in (info := api.status(run_id)):
        assert time.monotonic() < deadline, f"run {run_id} never showed a wait: {info}"
        time.sleep(0.05)
    return info["waiting"]


def iso(when: float) -> str:
    return datetime.fromtimestamp(when).astimezone().isoformat()


@pytest.mark.usefixtures("one_slot")
def test_200_waiting_runs_hold_no_slot_and_each_goes_on_at_its_time_or_signal() -> None:
    start = time.time() + 20  # every submit done by then; the timers come due 100 ms apart over 10 s
    dues = [start + 0.1 * i for i in range(WAITERS // 2)]
    sleepers = [api.submit(waiting_then_echo(until=iso(due))) for due in dues]
    listeners = [api.submit(waiting_then_echo(event="go", timeout="1h")) for _ in range(WAITERS // 2)]
    # The one pool process is free for a batch while 200 runs wait: it ends before the first timer.
    batch = {"nodes": [{"id": "b", "type": "test-slow", "params": {"seconds": 0.01}, "batch": {"items": "${xs}"}}]}
    done = api.wait(api.submit(batch, {"xs": list(range(50))}), timeout=60)
    assert done.shared["b"]["success_count"] == 50
    for run in listeners:
        shown_waiting(run)
    assert time.time() < start and client().zcard(TIMERS) == WAITERS  # every run recorded its timer
    assert {ClusterRuns().get(run).status for run in sleepers + listeners} == {"running"}
    sent = {}
    for run in listeners:  # signalled while the timers fire
        time.sleep(max(0.0, start + 0.1 * len(sent) + 0.05 - time.time()))
        sent[run] = time.time()
        api.signal(run, "go", {"run": run})
    late, heard = [], []
    for run, due in zip(sleepers, dues, strict=True):
        result = api.wait(run, timeout=120)
        assert result.status == "success"
        assert datetime.fromisoformat(result.shared["w"]["until"]).timestamp() == pytest.approx(due, abs=1e-3)
        late.append(ClusterRuns().get(run).updated - due)  # type: ignore[union-attr]
    for run in listeners:
        result = api.wait(run, timeout=120)
        assert result.shared["w"] == {"event": "go", "data": {"run": run}}
        heard.append(ClusterRuns().get(run).updated - sent[run])  # type: ignore[union-attr]
    # Ended (timer fired or signal taken, advance run, the echo node, the record written) this long after its due
    # time or its signal; a timer that never fired would end its run only after REFIRE_SECONDS (60) or never.
    late.sort()
    heard.sort()
    print(f"\n{len(late)} timers: ended after due by median {late[len(late) // 2]:.2f} s, max {late[-1]:.2f} s;"
          f" {len(heard)} signals: ended after the signal by median {heard[len(heard) // 2]:.2f} s,"
          f" max {heard[-1]:.2f} s")  # fmt: skip
    assert late[0] >= 0 and late[-1] < 30 and heard[-1] < 30
    assert client().zcard(TIMERS) == 0  # nothing left armed


@pytest.mark.usefixtures("one_slot")
def test_chordflow_signal_releases_an_events_wait_with_its_data() -> None:
    run = api.submit(waiting_then_echo(event="approved", timeout="1h"))
    waiting = shown_waiting(run)
    assert waiting["event"] == "approved" and waiting["text"].startswith("waiting for event 'approved' (until ")
    listed = subprocess.run([sys.executable, "-m", "scheduler.cli", "runs"], capture_output=True, text=True, timeout=60)
    assert f"{run}\t" in listed.stdout and waiting["text"] in listed.stdout  # `runs` shows the wait as its progress
    argv = [sys.executable, "-m", "scheduler.cli", "signal", run, "approved", "--data", '{"by": "ann"}']
    sent = subprocess.run(argv, capture_output=True, text=True, env=os.environ, timeout=60)
    assert sent.returncode == 0 and sent.stdout.strip() == f"sent 'approved' to run {run}", sent.stderr
    result = api.wait(run, timeout=60)
    assert result.shared["w"] == {"event": "approved", "data": {"by": "ann"}} and result.shared["e"]["got"]["data"]
    bad = subprocess.run([*argv[:-1], "{nope"], capture_output=True, text=True, env=os.environ, timeout=60)
    assert bad.returncode == 2 and "--data" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.usefixtures("one_slot")
def test_an_event_that_does_not_come_fails_the_node_at_its_timeout_and_an_error_edge_takes_it() -> None:
    wf = waiting_then_echo(event="approved", timeout=2)
    wf["edges"] = [{"from": "w", "to": "e", "action": "error"}]
    wf["nodes"][1]["params"] = {"why": "${_error.message}"}
    result = api.wait(api.submit(wf), timeout=60)
    assert result.status == "success" and "event 'approved' did not come by" in result.shared["e"]["why"]


@pytest.mark.usefixtures("one_slot")
def test_a_cancel_reaches_a_run_that_waits_and_purge_leaves_no_timer() -> None:
    run = api.submit(waiting_then_echo(event="never", timeout="1d"))
    shown_waiting(run)
    assert client().zscore(TIMERS, f"{run}|w#0") is not None
    api.cancel(run)
    deadline = time.monotonic() + 30
    while api.status(run)["status"] != "cancelled":
        assert time.monotonic() < deadline, "the waiting run never read cancelled"
        time.sleep(0.05)
    api.purge(run)
    assert client().zscore(TIMERS, f"{run}|w#0") is None


@pytest.mark.processes
def test_a_wait_outlives_every_worker_and_redis_restarting_with_aof(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, plugins=PLUGINS, redis_args=["--appendonly", "yes", "--appendfsync", "always"])
    previous = cluster.apply_env()
    try:
        worker = cluster.start_worker("t1")
        run = api.submit(waiting_then_echo(seconds=4))
        due = shown_waiting(run)["until"]
        worker.kill()  # every worker gone, and the state store with them
        cluster.redis.kill()
        cluster.redis.restart()
        while time.time() < due + 1:  # nothing runs the run while it is due
            time.sleep(0.1)
        assert ClusterRuns().get(run).status == "running"  # type: ignore[union-attr]
        cluster.start_worker("t2")
        result = api.wait(run, timeout=60)
        assert result.status == "success"
        assert datetime.fromisoformat(result.shared["w"]["until"]).timestamp() == pytest.approx(due, abs=1e-3)
        print(json.dumps({"due": due, "ended": ClusterRuns().get(run).updated}))  # type: ignore[union-attr]
    finally:
        cluster.restore_env(previous)
        cluster.stop()
