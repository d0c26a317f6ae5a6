"""A client driving a run, SIGKILLed with its batch's messages queued: their aging records go once its lease ends.

The client runs `scheduler.run(backend="celery")`, so the run's record is in the client's embedded store and the
cluster never learns of its end from it. Its chunk messages, sent below the top priority, are recorded for aging
(worker/cluster/aging.py); one that never begins (the broker lost it: a worker killed between taking it and recording
that it held it, schedule 116 of the fault campaign, tests/chaos/) kept its record, and its run its place in
`cf:{queued}`, after the run read failed. Now the client holds a lease on the run (`driver`, renewed while it waits
on a batch) and a worker's aging sweep forgets the queued messages of a run with no record in Redis and no live
driver.

Real redis-server, a real `celery` worker, a real client process. The worker consumes another queue, so the chunks
stay queued, never begun (the state the lost message left); it still sweeps. Aging is set to an hour, so no copy
of a message takes its record away first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
import redis

from scheduler.lookup import find_run
from tests.support.cluster import sweeping_cluster
from tests.worker.cluster.faults.test_long_chunks import until
from worker.cluster import aging
from worker.cluster.app import current_app
from worker.cluster.state.keys import AGING_SWEEP, QUEUED, RunKeys, run_key
from worker.cluster.state.runstate import DRIVER_LEASE, RunState, client

#: A client driving one run in its own process: prints `run <id>`, then runs it (as tests/chaos/runner.py does).
CLIENT = """import json, sys
import scheduler
wf, given, run_id = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
print("run", run_id, file=sys.stderr, flush=True)
scheduler.run(wf, given, backend="celery", run_id=run_id)
"""
#: Seconds between aging sweeps (an hour's aging: at most every 5 s, worker/cluster/aging.py Sweeper).
SWEEP_SECONDS = 5
#: Seconds for a sweep to forget them once the lease ran out: the lease, a sweep interval (5 s) and room to spare.
WITHIN = DRIVER_LEASE + 20


def sweeps(r: redis.Redis, count: int) -> None:
    """Return once `count` aging sweeps have started from now: each sets AGING_SWEEP afresh for its interval (the
    key's remaining time goes up). Fails if none starts for three intervals."""
    seen, last, deadline = 0, r.pttl(AGING_SWEEP), time.monotonic() + 3 * SWEEP_SECONDS
    while seen < count:
        now = r.pttl(AGING_SWEEP)
        if now > last:
            seen, deadline = seen + 1, time.monotonic() + 3 * SWEEP_SECONDS
        last = now
        assert time.monotonic() < deadline, f"no aging sweep for {3 * SWEEP_SECONDS} s ({seen} of {count} seen)"
        time.sleep(0.05)  # a poll's pace


@pytest.mark.processes
def test_a_sigkilled_driving_clients_queued_messages_are_forgotten_after_its_lease(tmp_path: Path) -> None:
    with sweeping_cluster(tmp_path) as cluster:
        r = redis.Redis.from_url(cluster.redis.url)
        run_id = f"cl{uuid.uuid4().hex[:10]}"
        keys = RunKeys(run_id)
        batch = {"items": "${items}", "chunk_size": 1}
        wf = {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": batch}]}
        argv = [sys.executable, "-c", CLIENT, json.dumps(wf), json.dumps({"items": [1, 2]}), run_id]
        env = {**os.environ, **cluster.env}
        client = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            assert client.stderr is not None and client.stderr.readline().startswith("run ")
            # Its window sent (two chunks go whole): each recorded for aging, its id listed once the sends returned.
            until(lambda: r.llen(keys.chunk_ids) == 2, 60, "the client's two chunks sent")
            assert r.zcard(keys.queued) == 2 and r.zscore(QUEUED, run_id) is not None
            # While the client lives its lease is renewed: sweeps past the lease's length keep its records.
            sweeps(r, DRIVER_LEASE // SWEEP_SECONDS + 2)
            assert r.zcard(keys.queued) == 2 and r.zscore(QUEUED, run_id) is not None
            client.send_signal(signal.SIGKILL)
            client.wait()
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
        record, _ = find_run(run_id)
        assert record.status == "failed" and "is gone" in (record.error or "")

        def left() -> list[str]:
            held = [k for k in (keys.queued, keys.queued_messages) if r.exists(k)]
            return held + ([QUEUED] if r.zscore(QUEUED, run_id) is not None else [])

        until(lambda: not left(), WITHIN, f"the dead client's queued messages forgotten (left: {left()})")


@pytest.mark.usefixtures("celery_cluster")
def test_a_sweep_forgets_the_queued_messages_of_runs_that_ended_and_keeps_those_of_live_ones() -> None:
    """Each run with one recorded message, not yet due for a copy; one sweep (worker/cluster/state/lua/
    forget_queued.lua) forgets those of a run that ended or has neither a record nor a live driver; a run cancelled
    but not ended keeps them (it ends once its chunks reported: a lost one must still be sent again)."""
    r, stamp = client(), time.time_ns()
    runs = {name: f"{name}{stamp}" for name in ("running", "succeeded", "cancelled", "driven", "undriven")}
    for run_id in runs.values():
        keys, task_id = RunKeys(run_id), f"{uuid.uuid4().hex}-1"
        r.zadd(keys.queued, {task_id: time.time()})
        r.hset(keys.queued_messages, task_id, msgpack.packb(["t", [run_id], "normal", 1, time.time(), {}]))
        r.zadd(QUEUED, {run_id: time.time()})
    r.hset(run_key(runs["running"], "run"), "status", "running")
    r.hset(run_key(runs["succeeded"], "run"), "status", "succeeded")
    r.hset(run_key(runs["cancelled"], "run"), "status", "running")
    RunState(runs["cancelled"], r).cancel()
    RunState(runs["driven"], r).keep_driver()
    aging.sweep(current_app())
    kept = {name for name, run_id in runs.items() if r.exists(RunKeys(run_id).queued)}
    listed = {name for name, run_id in runs.items() if r.zscore(QUEUED, run_id) is not None}
    assert kept == listed == {"running", "cancelled", "driven"}
    assert not any(r.exists(RunKeys(runs[name]).queued_messages) for name in ("succeeded", "undriven"))
