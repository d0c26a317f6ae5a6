"""Fair dispatch between runs and run priorities, on real redis-server and workers.

A batch's chunks go to the broker a window at a time (worker/cluster/batches/dispatch.py), so a small run is
not queued behind a big one's whole batch; a higher run's messages go first (worker/cluster/priorities.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu.exceptions
import msgpack
import pytest

from ir import snapshot
from scheduler import api, durable
from scheduler.localcluster import Cluster, free_port
from tests.scheduler.test_durable import VISIBILITY_TIMEOUT
from tests.support.cluster import PLUGINS, destroyable_cluster
from worker import settings
from worker.cluster import aging, priorities
from worker.cluster.app import current_app
from worker.cluster.batches.dispatch import window_size
from worker.cluster.state.keys import QUEUED, run_key
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState, client
from worker.cluster.state.windows import BatchWindow

#: A big run: 2,000 items of 10 ms, about 10 s on the suite's two workers.
BIG = 2000


def slow_batch(seconds: float, **batch: Any) -> dict[str, Any]:
    node = {"id": "b", "type": "test-slow", "params": {"seconds": seconds}, "batch": {"items": "${items}", **batch}}
    return {"nodes": [node]}


def progress(run_id: str) -> int:
    """Distinct items with an outcome on the run's progress stream so far."""
    state, position, seen = RunState(run_id), "0-0", set()
    while True:
        position, entries = state.read_progress(position, 0)
        if not entries:
            return len(seen)
        for _, packed in entries:
            if packed is not None:
                seen.update(index for index, _ in RunState.unpack_outcomes(packed))


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        time.sleep(0.05)


def status(run_id: str) -> str | None:
    record = ClusterRuns().get(run_id)
    return record.status if record else None


def indexes(result: Any) -> list[int]:
    return [r["index"] for r in result.shared["b"]["results"]]


@pytest.mark.usefixtures("celery_cluster")
def test_a_small_run_finishes_while_a_big_one_is_still_running() -> None:
    big = api.submit(slow_batch(0.01), {"items": list(range(BIG))})
    wait_until(lambda: progress(big) > 0, 60, "the big run's first item")
    small = api.submit(slow_batch(0.001), {"items": [0, 1, 2]})
    assert indexes(api.wait(small, timeout=120)) == [0, 1, 2]
    # Measured when the small run had ended: the big one was still running, most of its items still to run.
    assert status(big) == "running"
    assert progress(big) < BIG
    result = api.wait(big, timeout=300)
    assert indexes(result) == list(range(BIG))  # the big run: every index once, in order


@contextlib.contextmanager
def own_cluster(workdir: Path, **env: str) -> Iterator[None]:
    """Two one-process workers on a redis-server of their own, `env` added; this process points at them meanwhile.
    For tests that need the workers to themselves: on the suite's shared cluster, batches a previous test left in
    the share of the workers (worker/cluster/state/windows.py) can leave a worker free for any queued run."""
    cluster = Cluster(workdir, plugins=PLUGINS)
    cluster.env.update(env)
    previous = cluster.apply_env()
    try:
        cluster.start_worker("k1")
        cluster.start_worker("k2")
        yield
    finally:
        cluster.restore_env(previous)
        cluster.stop()


@pytest.mark.processes
def test_a_high_priority_run_passes_a_low_one_queued_before_it(tmp_path: Path) -> None:
    # The normal run's items take 40 s of work (20 s on the two workers): under any load it outlasts the high run's
    # four tasks, so the low run still has normal chunks ahead of it when the high one ends (and it is cancelled
    # then: its chunks running out is what serves the low run).
    with own_cluster(tmp_path):
        big = api.submit(slow_batch(0.02), {"items": list(range(BIG))})
        wait_until(lambda: progress(big) > 0, 60, "the big run's first item")
        low = api.submit(slow_batch(0.001), {"items": [0, 1, 2]}, priority="low")
        high = api.submit(slow_batch(0.001), {"items": [0, 1, 2]}, priority="high")
        assert ClusterRuns().get(high).priority == "high"  # type: ignore[union-attr]
        assert indexes(api.wait(high, timeout=120)) == [0, 1, 2]
        # The low run went in first but waits behind the normal run's chunks; the high one passed both.
        assert (status(big), status(low)) == ("running", "queued"), f"{progress(big)} of the big run's items ran"
        api.cancel(big)
        assert indexes(api.wait(low, timeout=300)) == [0, 1, 2]  # served once the normal run's chunks ran out


@pytest.mark.usefixtures("celery_cluster")
def test_a_workflows_priority_field_is_the_runs_unless_submit_names_one() -> None:
    wf = {**slow_batch(0.001), "priority": "low"}
    assert ClusterRuns().get(api.submit(wf, {"items": [1]})).priority == "low"  # type: ignore[union-attr]
    assert ClusterRuns().get(api.submit(wf, {"items": [1]}, priority="high")).priority == "high"  # type: ignore[union-attr]
    assert api.status(api.submit(slow_batch(0.001), {"items": [1]}))["priority"] == "normal"


def test_message_priorities_order_high_before_low_on_both_brokers_and_age() -> None:
    order = [(p, kind) for p in ("high", "normal", "low") for kind in (priorities.CONTROL, priorities.CHUNK)]
    on_redis = [priorities.message_priority("redis://h:1/0", p, kind) for p, kind in order]
    on_amqp = [priorities.message_priority("amqp://h//", p, kind) for p, kind in order]
    assert on_redis == sorted(on_redis) and len(set(on_redis)) == 6  # kombu's Redis steps: 0 first
    assert on_amqp == sorted(on_amqp, reverse=True) and max(on_amqp) <= priorities.MAX  # AMQP: highest first
    # Aging: a low batch's chunks go as normal ones after one period, as high ones after two.
    assert priorities.rank("low", waited=59, aging=60) == 2
    assert priorities.rank("low", waited=61, aging=60) == 1
    assert priorities.rank("low", waited=125, aging=60) == 0


@pytest.mark.usefixtures("celery_cluster")
def test_a_batch_window_counts_each_finish_once_and_hands_out_its_claims_again() -> None:
    """The window's bookkeeping on the real redis-server: a redelivered chunk (its worker killed after recording
    it) gets the chunks its finish had claimed again, and exactly one finish ends the batch."""
    state = RunState(f"win{time.time_ns()}", client())
    window = BatchWindow(state, "b#0")
    blocks = [(a, a + 10, snapshot.encode(list(range(a, a + 10)))) for a in range(0, 50, 10)]
    first = window.plan(blocks, {"meta": {}}, window=2, max_items=20, min_items=1, chunk_seconds=2.0, priority="low")
    assert first.state == "go" and first.priority == "low" and first.waited == 0
    assert [(c.start, c.end) for c in first.chunks] == [(0, 10), (10, 20)]  # one block each until measured
    one = window.finish(0, b"out0", 10, 0.01, 2)  # 1 ms an item: 2 s of work is more than max_items
    assert [(c.start, c.end, c.blocks) for c in one.chunks] == [(20, 40, [20, 30])]
    assert 0 <= one.waited < 60  # claimed to begun: how long chunk 0 waited in the queue (here: not at all)
    again = window.finish(0, b"other", 10, 0.01, 2)
    assert again.state == "dup" and again.chunks == one.chunks  # counted once; its claims handed out again
    assert window.finish(10, b"out10", 10, 0.01, 2).chunks[0].start == 40
    assert window.finish(20, b"out20", 20, 0.02, 2).state == "go"
    late = window.finish(0, b"other", 10, 0.01, 2)  # delivered again after its claim (chunk 20) finished
    assert late.state == "dup" and late.chunks == []  # only what is still in flight goes again: 20's items are gone
    assert window.finish(40, b"out40", 10, 0.01, 2).state == "end"
    assert window.finish(40, b"out40", 10, 0.01, 2).state == "dupend"
    assert window.outcomes() == [b"out0", b"out10", b"out20", b"out40"]
    stale = BatchWindow(state, "b#0", "an-earlier-plan")
    assert stale.finish(0, b"x", 10, 0.01, 2).state == "stale"


@pytest.mark.processes
def test_every_index_once_after_workers_are_sigkilled_during_refills(tmp_path: Path) -> None:
    total = 600
    with destroyable_cluster(tmp_path, 5) as cluster:
        run_id = durable.submit(slow_batch(0.005, chunk_size=10), {"items": list(range(total))})
        wait_until(lambda: progress(run_id) >= 100, 90, "100 items")
        cluster.workers["k1"].kill(signal.SIGKILL)  # 60 chunks, each finish hands out the next: mid-refill or near
        cluster.start_worker("k3")
        wait_until(lambda: progress(run_id) >= 300, 90, "300 items")
        cluster.workers["k3"].kill(signal.SIGKILL)
        result = durable.wait(run_id, timeout=180)
        assert result.status == "success"
        assert indexes(result) == list(range(total))  # each outcome once, in order
        assert result.shared["b"]["success_count"] == total


def test_submit_priority_from_the_cli_shows_in_status_and_runs(celery_cluster: Cluster, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(slow_batch(0.001)))
    env = {**celery_cluster.env, "CHORDFLOW_PLUGINS": PLUGINS, "COLUMNS": "200"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "scheduler.cli", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    submitted = cli("submit", str(wf), "--input", "items=[1,2]", "--priority", "high")
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.strip()
    api.wait(run_id, timeout=120)
    assert "priority: high" in cli("status", run_id).stdout
    assert json.loads(cli("status", run_id, "--json").stdout)["priority"] == "high"
    row = next(line for line in cli("runs", "--limit", "50").stdout.splitlines() if run_id in line)
    assert "high" in row
    refused = cli("submit", str(wf), "--input", "items=[1]", "--priority", "urgent")
    assert refused.returncode == 2 and "'urgent' is not one of 'high', 'normal', 'low'" in refused.stderr
    local = cli("run", str(wf), "--input", "items=[1]", "--priority", "high")  # nothing queued: refused, not ignored
    assert (local.returncode, local.stderr) == (
        2,
        "error: --priority: only with --backend celery and without --stream (a local run is not queued)\n",
    )


def test_batches_sharing_the_workers_divide_the_window() -> None:
    assert window_size(processes=2, open_windows=1) == 3  # alone: one chunk waiting per process
    assert window_size(processes=2, open_windows=3) == 1  # three batches: one each, a newcomer waits ~one chunk
    assert window_size(processes=8, open_windows=2) == 5
    assert window_size(processes=2, open_windows=50) == 1  # never none


# -- aging: low priority is never starved (worker/cluster/aging.py) ----------------------------------------------


#: Aging a level up per second waited, and short chunks (the big batch hands out its next ones often).
AGING_ENV = {"CHORDFLOW_PRIORITY_AGING": "1", "CHORDFLOW_CHUNK_SECONDS": "0.5"}


def low_run_behind_endless_higher_work(tmp_path: Path) -> None:
    """Higher-priority chunks arrive without a gap: the normal batch hands out its next chunks before each one
    ends, so a low run's messages, already queued, would wait for the whole batch. Aged one level up per second
    waited (copies of the queued messages), the low run ends while the normal one still runs, each item once.
    On the cluster this process points at (AGING_ENV, two one-process workers)."""
    log = tmp_path / "log"
    low_wf = {"nodes": [{
        "id": "b", "type": "test-side-effect", "params": {"log": str(log), "label": "${item}"},
        "batch": {"items": "${items}"},
    }]}  # fmt: skip
    big = api.submit(slow_batch(0.02), {"items": list(range(BIG))})
    wait_until(lambda: progress(big) > 0, 60, "the big run's first item")
    low = api.submit(low_wf, {"items": [0, 1, 2]}, priority="low")
    assert api.wait(low, timeout=120).shared["b"]["success_count"] == 3
    # The big run: about 20 s of work. Without aging the low run waited for nearly all of it (1,974 of 2,000
    # items done when it ended, measured on Redis); with it, for a few of its chunks per message (746).
    assert status(big) == "running"
    assert progress(big) < BIG // 2
    assert sorted(log.read_text().split()) == ["0", "1", "2"]  # copies sent, yet each item ran once
    assert indexes(api.wait(big, timeout=300)) == list(range(BIG))


@pytest.mark.processes
def test_a_low_run_behind_endless_higher_work_is_sent_again_higher_and_finishes(tmp_path: Path) -> None:
    with own_cluster(tmp_path, **AGING_ENV):
        low_run_behind_endless_higher_work(tmp_path)


@pytest.mark.usefixtures("celery_cluster")
def test_a_message_and_its_aging_copy_run_once_whichever_begins_first() -> None:
    redis_client, run_id, first = client(), f"aging{time.time_ns()}", uuid.uuid4().hex
    original, copy = f"{first}-2", f"{first}-1"
    redis_client.hset(run_key(run_id, "copies"), mapping={original: first, copy: first})  # what a sweep records
    assert aging.begin(redis_client, run_id, copy, ttl=60)  # the copy (sent one level up) began first
    assert not aging.begin(redis_client, run_id, original, ttl=60)  # the original, delivered later: skipped
    assert aging.begin(redis_client, run_id, copy, ttl=60)  # the copy delivered again (its worker died): runs
    assert aging.begin(redis_client, run_id, f"{uuid.uuid4().hex}-1", ttl=60)  # never copied: runs
    assert aging.begin(redis_client, run_id, str(uuid.uuid4()), ttl=60)  # not a tracked id: nothing to check


@pytest.mark.usefixtures("celery_cluster")
def test_a_run_whose_message_is_sent_as_a_sweep_unlists_it_stays_listed() -> None:
    """The race that starved a low run's last advance (CI, RabbitMQ): a sweep saw the run's queue empty, the run's
    next advance was recorded (its queue, then the index of runs), and the sweep's ZREM then took the run off the
    index. `unlist` looks again after its ZREM: the run stays listed, and the next sweep copies its advance."""
    redis_client, run_id = client(), f"aging{time.time_ns()}"
    redis_client.zadd(run_key(run_id, "queued"), {f"{uuid.uuid4().hex}-2": time.time()})  # recorded meanwhile
    redis_client.zadd(QUEUED, {run_id: time.time()})
    aging.unlist(redis_client, run_id)
    assert redis_client.zscore(QUEUED, run_id) is not None
    redis_client.delete(run_key(run_id, "queued"))  # nothing queued now: unlisted for good
    aging.unlist(redis_client, run_id)
    assert redis_client.zscore(QUEUED, run_id) is None


@pytest.mark.usefixtures("celery_cluster")
def test_a_copy_that_cannot_be_sent_leaves_its_message_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep forgets a message, then sends its copy: when the broker is not there (a real one, at a port nothing
    listens on) the send raises, and the message is watched again, to be copied by a later sweep, not left queued
    low with no record (starved)."""
    monkeypatch.setenv("CHORDFLOW_POOL_TIMEOUT", "1")
    s = dataclasses.replace(settings.load(), broker_url=f"redis://127.0.0.1:{free_port()}/0", priority_aging=1)
    app = current_app(s)
    redis_client, run_id, task_id = client(), f"aging{time.time_ns()}", f"{uuid.uuid4().hex}-2"
    sent = time.time() - 5  # a low message that waited 5 periods
    redis_client.zadd(run_key(run_id, "queued"), {task_id: sent})
    redis_client.hset(run_key(run_id, "queued_msgs"), task_id, msgpack.packb(["t", [run_id], "low", 1, sent, {}]))
    redis_client.zadd(QUEUED, {run_id: time.time()})
    redis_client.set(run_key(run_id, "driver"), 1, ex=60)  # a live client drives the run (no record in Redis)
    with pytest.raises(kombu.exceptions.OperationalError):
        aging.sweep(app)
    assert redis_client.zrange(run_key(run_id, "queued"), 0, -1) == [task_id.encode()]
    assert redis_client.hexists(run_key(run_id, "queued_msgs"), task_id)
    assert redis_client.zscore(QUEUED, run_id) is not None


@pytest.mark.processes
def test_an_advance_killed_after_planning_a_batch_before_sending_a_chunk_is_picked_up(tmp_path: Path) -> None:
    """The advance that planned the batch (its chunks claimed in the window) dies before sending one: its
    redelivery finds the batch dispatched and sends the claimed chunks again; every item runs once."""
    log, marker = tmp_path / "log", tmp_path / "killed"
    wf = {"nodes": [{
        "id": "b", "type": "test-side-effect", "params": {"log": str(log), "label": "${item}"},
        "batch": {"items": "${items}", "chunk_size": 5},
    }]}  # fmt: skip
    cluster = Cluster(tmp_path, visibility_timeout=VISIBILITY_TIMEOUT, plugins=f"{PLUGINS},tests.support.faults")
    cluster.env["CHORDFLOW_TEST_KILL_BEFORE_SEND"] = str(marker)
    previous = cluster.apply_env()
    try:
        workers = [cluster.start_worker("k1"), cluster.start_worker("k2")]
        run_id = durable.submit(wf, {"items": list(range(20))})
        wait_until(marker.exists, 60, "a worker to die between planning and sending")
        wait_until(lambda: any(w.proc.poll() is not None for w in workers), 30, "the worker to be gone")
        result = durable.wait(run_id, timeout=120)
    finally:
        cluster.restore_env(previous)
        cluster.stop()
    assert result.status == "success"
    assert [r["label"] for r in result.shared["b"]["results"]] == [str(i) for i in range(20)]
    assert sorted(log.read_text().split(), key=int) == [str(i) for i in range(20)]  # each item once


@pytest.mark.usefixtures("celery_cluster")
def test_a_chunk_runs_from_the_first_of_its_messages_to_begin_and_never_from_an_earlier_plan() -> None:
    """BatchWindow.begin on the real redis-server: a copy (or a chunk a redelivered advance sent again) is skipped
    once one message of the chunk began; a redelivery of that one begins again; a chunk of an earlier plan never
    begins (a resume planned the batch again), while a chunk of no window at all (sent by hand) does."""
    state = RunState(f"begin{time.time_ns()}", client())
    window = BatchWindow(state, "b#0")
    window.plan([(0, 10, snapshot.encode(list(range(10))))], {"meta": {}}, window=2, max_items=10, min_items=1,
                chunk_seconds=2.0, priority="normal")  # fmt: skip
    assert window.begin(0, "task-a")
    assert not window.begin(0, "task-b")  # a second message of chunk 0
    assert window.begin(0, "task-a")  # task-a delivered again: its worker died
    assert not BatchWindow(state, "b#0", "an-earlier-plan").begin(0, "task-c")
    assert BatchWindow(RunState(f"nowindow{time.time_ns()}", client()), "b#0", "no-plan").begin(0, "task-d")
    window.drop()  # merged: a second message of chunk 0 delivered after that still finds it begun
    assert not window.begin(0, "task-e")
