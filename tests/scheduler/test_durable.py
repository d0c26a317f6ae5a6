"""Cluster runs under failure, with a real redis-server and real worker processes (no fakes).

A cluster run lives in Redis and advances through `chordflow.advance` tasks (worker/cluster/advance.py), so
it must survive whatever happens to the process that submitted it and to the workers running it. Tests
that destroy part of a cluster get their own (low visibility timeout); the others use the suite's.
Side effects are counted in files: "ran exactly once" is a fact on disk.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis import Redis

import scheduler
from scheduler import durable
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import assert_one_line_error
from tests.support import dist_nodes  # noqa: F401  (the test node types, in this process too)
from tests.support.cluster import PLUGINS, ctrl_c_as_in_a_terminal, destroyable_cluster
from tests.support.kinds import starts
from tests.support.sockets import redis_clients_of
from worker.cluster.app import current_app
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState

ROOT = Path(__file__).parents[2]

VISIBILITY_TIMEOUT = 5


@pytest.fixture
@starts("faults")
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with destroyable_cluster(tmp_path, VISIBILITY_TIMEOUT) as cluster:
        yield cluster


# -- helpers ---------------------------------------------------------------------------------------------


def cli(cluster: Cluster, *args: Any, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`chordflow ARGS` as a subprocess pointed at `cluster`."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *map(str, args)],
        cwd=ROOT,
        env={**cluster.env, "CHORDFLOW_PLUGINS": PLUGINS, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_wf(tmp_path: Path, wf: dict[str, Any], name: str = "wf.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(wf))
    return path


def side_effect(node_id: str, log: Path, **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "test-side-effect", "params": {"log": str(log), "label": node_id, **params}}


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` (Redis, a file) until it is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)


def worker_lines(cluster: Cluster, text: str) -> list[str]:
    """The lines of the cluster's workers' logs holding `text`."""
    return [line for w in cluster.workers.values() for line in w.log.read_text().splitlines() if text in line]


def wait_progress(run_id: str, items: int, timeout: float = 60) -> int:
    """Block on the run's progress stream (XREAD) until `items` distinct item outcomes were published."""
    state = RunState(run_id)
    position, seen = "0-0", set()
    deadline = time.monotonic() + timeout
    while len(seen) < items:
        assert time.monotonic() < deadline, f"only {len(seen)} of {items} items ran within {timeout}s"
        position, entries = state.read_progress(position, 500)
        for _, packed in entries:
            if packed is not None:
                seen.update(index for index, _ in RunState.unpack_outcomes(packed))
    return len(seen)


def record_status(run_id: str) -> str | None:
    record = ClusterRuns().get(run_id)
    return record.status if record else None


# -- the submitting process goes away ---------------------------------------------------------------------


def test_run_completes_after_the_submitting_process_exits(broker: Cluster, tmp_path: Path) -> None:
    total = 50
    prep = {"id": "prep", "type": "echo", "params": {"v": 1}}  # a plain node first: the batch is not step 0
    batch = {
        "id": "b",
        "type": "test-slow",
        "params": {"seconds": 0.01},
        "batch": {"items": "${items}", "chunk_size": 10},
    }
    wf = write_wf(tmp_path, {"nodes": [prep, batch]})
    proc = cli(broker, "submit", wf, "--input", f"items={json.dumps(list(range(total)))}")
    assert proc.returncode == 0, proc.stderr
    run_id = proc.stdout.strip()
    assert proc.stdout == run_id + "\n" and re.fullmatch(r"[0-9a-f]{12}", run_id), proc.stdout  # the id only
    result = scheduler.wait(run_id, timeout=60)  # the public API (scheduler/api.py)
    assert result.status == "success" and result.run_id == run_id
    assert scheduler.status(run_id)["status"] == "succeeded"
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], aggregate["error_count"]) == (total, total, 0)
    assert [r["index"] for r in aggregate["results"]] == list(range(total))
    status = cli(broker, "status", run_id, "--json")
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert (info["status"], info["backend"], info["steps"]) == ("succeeded", "celery", 2)
    assert info["batches"]["b"] == {"total": total, "done": total, "failed": 0}


# -- workers die -------------------------------------------------------------------------------------------


def test_sigkilled_worker_mid_batch_loses_and_duplicates_nothing(own_cluster: Cluster) -> None:
    total = 3000
    wf = {"nodes": [{"id": "b", "type": "test-slow", "params": {"seconds": 0.002}, "batch": {"items": "${items}"}}]}
    run_id = durable.submit(wf, {"items": list(range(total))})
    wait_progress(run_id, total // 5)
    assert record_status(run_id) == "running"
    own_cluster.workers["k1"].kill(signal.SIGKILL)  # mid-chunk: its chunk is unacknowledged
    result = durable.wait(run_id, timeout=VISIBILITY_TIMEOUT + 90)
    assert result.status == "success"
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], aggregate["error_count"]) == (total, total, 0)
    assert [r["index"] for r in aggregate["results"]] == list(range(total))  # each outcome once, in order


def test_every_worker_killed_during_a_plain_node_then_new_workers_finish_the_run(
    own_cluster: Cluster, tmp_path: Path
) -> None:
    log = tmp_path / "log"
    wf = {"nodes": [side_effect("n1", log, seconds=3), side_effect("n2", log)]}
    run_id = durable.submit(wf)
    until(lambda: ClusterRuns().get(run_id).status == "running", 60, "the first advance to start n1")
    for worker in own_cluster.workers.values():
        worker.kill(signal.SIGKILL)
    assert lines(log) == []  # n1 was cut off mid-way (it sleeps 3 s before writing)
    assert record_status(run_id) == "running" and ClusterRuns().get(run_id).step == 0
    own_cluster.start_worker("k3")
    own_cluster.start_worker("k4")
    # The advance comes back after the visibility timeout, then retries until the dead holder's lease expires.
    result = durable.wait(run_id, timeout=90)
    assert result.status == "success"
    assert lines(log) == ["n1", "n2"]  # n1 ran again (it was killed mid-way), n2 once
    assert ClusterRuns().trail(run_id) == ["n1", "n2"]


# -- cancel and resume ---------------------------------------------------------------------------------------


def test_cancel_mid_batch_then_resume_runs_every_item_exactly_once(broker: Cluster, tmp_path: Path) -> None:
    total = 300
    log, first_log = tmp_path / "log", tmp_path / "first"
    node = side_effect("b", log, label="${item}", seconds=0.02)
    node["batch"] = {"items": "${items}", "chunk_size": 5}
    run_id = durable.submit({"nodes": [side_effect("first", first_log), node]}, {"items": list(range(total))})
    until(lambda: len(lines(log)) >= 10, 60, "items to run")
    cancel = cli(broker, "cancel", run_id)
    assert cancel.returncode == 0, cancel.stderr
    assert f"cancel requested for run {run_id}" in cancel.stdout
    first = durable.wait(run_id, timeout=60)
    assert first.status == "cancelled"
    assert record_status(run_id) == "cancelled"
    before = lines(log)
    assert 10 <= len(before) < total, len(before)  # the cancel cut the batch short
    resumed = cli(broker, "resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == run_id + "\n"
    result = durable.wait(run_id, timeout=90)
    assert result.status == "success"
    assert [r["label"] for r in result.shared["b"]["results"]] == [str(i) for i in range(total)]
    after = lines(log)
    assert after[: len(before)] == before
    assert sorted(map(int, after)) == list(range(total))  # every item exactly once overall
    assert lines(first_log) == ["first"]  # the node before the batch was not run again
    rows = [json.loads(line) for line in cli(broker, "results", run_id, "--node", "b").stdout.splitlines()]
    assert [r["index"] for r in rows] == list(range(total))  # chunks kept before the cancel + the resumed ones
    assert [r["result"]["label"] for r in rows] == [str(i) for i in range(total)]


# -- duplicates ----------------------------------------------------------------------------------------------


def test_duplicated_advance_for_the_same_step_is_fenced(celery_cluster: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "log"
    run_id = durable.submit({"nodes": [side_effect("n1", log, seconds=1.5), side_effect("n2", log)]})
    duplicate = current_app().send_task("chordflow.advance", (run_id, 0))
    result = durable.wait(run_id, timeout=60)
    assert result.status == "success"
    # Whichever of the two took the run's lease first ran it; the other found the step taken (or done). No Celery
    # result is stored (nothing reads one): the worker's log line says what the task returned.
    ended = until(lambda: worker_lines(celery_cluster, f"Task chordflow.advance[{duplicate.id}] succeeded"), 60, "it")
    assert re.search(r": '(fenced|succeeded)'$", ended[0]), ended
    assert lines(log) == ["n1", "n2"]
    assert ClusterRuns().trail(run_id) == ["n1", "n2"]


# -- the CLI ---------------------------------------------------------------------------------------------------


def summary(proc: subprocess.CompletedProcess[str]) -> str:
    """The summary on stdout, without what differs from run to run (duration, run id)."""
    return re.sub(r"\d+\.\d+s, run [0-9a-f]+\)", "<duration>, run <id>)", proc.stdout)


def test_cli_run_detach_and_wait_on_the_cluster(celery_cluster: Cluster, tmp_path: Path) -> None:
    prep = {"id": "prep", "type": "echo", "params": {"v": 1}}
    batch = {"id": "b", "type": "test-fail", "params": {"value": "${item}", "fail_on": 2},
             "batch": {"items": "${items}", "error_handling": "continue", "chunk_size": 2}}  # fmt: skip
    wf = write_wf(tmp_path, {"nodes": [prep, batch], "outputs": {"n": {"source": "${b.count}"}}})
    items = "items=[0,1,2,3,4]"
    local = cli(celery_cluster, "run", wf, "--input", items)
    assert local.returncode == 0, local.stderr
    assert "b: 5 items, 4 succeeded, 1 failed" in local.stdout and "n = 5" in local.stdout
    on_cluster = cli(celery_cluster, "run", wf, "--input", items, "--backend", "celery")
    assert on_cluster.returncode == 0, on_cluster.stderr
    assert summary(on_cluster) == summary(local)

    detached = cli(celery_cluster, "run", wf, "--input", items, "--backend", "celery", "--detach")
    assert detached.returncode == 0, detached.stderr
    run_id = detached.stdout.strip()
    assert detached.stdout == run_id + "\n" and re.fullmatch(r"[0-9a-f]{12}", run_id), detached.stdout
    waited = cli(celery_cluster, "wait", run_id)
    assert waited.returncode == 0, waited.stderr
    assert summary(waited) == summary(local)

    gate = tmp_path / "gate"  # the node finishes only once the test opens it: the run is still going at `wait`
    params = {"log": str(tmp_path / "held.log"), "label": "held", "gate": str(gate)}
    held = write_wf(tmp_path, {"nodes": [{"id": "s", "type": "test-side-effect", "params": params}]}, "held.json")
    held_id = cli(celery_cluster, "run", held, "--backend", "celery", "--detach").stdout.strip()
    timed_out = cli(celery_cluster, "wait", held_id, "--timeout", "0.5")
    assert timed_out.returncode == 124, (timed_out.stdout, timed_out.stderr)
    gate.touch()
    assert durable.wait(held_id, timeout=60).status == "success"  # the run went on

    failing = write_wf(
        tmp_path, {"nodes": [prep, {"id": "boom", "type": "test-fail", "params": {"fail": True}}]}, "f.json"
    )
    fail_id = cli(celery_cluster, "run", failing, "--backend", "celery", "--detach").stdout.strip()
    line = assert_one_line_error(cli(celery_cluster, "wait", fail_id), 1)
    assert line.startswith("error: ValueError: boom None"), line  # the node's exception, raised again
    assert record_status(fail_id) == "failed"


def test_ctrl_c_on_wait_stops_waiting_and_the_run_goes_on(celery_cluster: Cluster, tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", tmp_path / "held.log"
    params = {"log": str(log), "label": "held", "gate": str(gate)}
    held = write_wf(tmp_path, {"nodes": [{"id": "s", "type": "test-side-effect", "params": params}]})
    run_id = cli(celery_cluster, "run", held, "--backend", "celery", "--detach").stdout.strip()
    redis = Redis.from_url(celery_cluster.redis.url)
    waiting = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "wait", run_id], cwd=ROOT,
        env={**celery_cluster.env, "CHORDFLOW_PLUGINS": PLUGINS}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    try:
        # `wait` follows the run's progress stream with a blocking XREAD: it is in its loop once Redis sees one on
        # its own connection (a worker's connection may be new too, and have read the stream last)
        following = lambda: any(c["cmd"] == "xread" for c in redis_clients_of(waiting.pid, redis.client_list()))  # noqa: E731
        until(following, 60, "wait to follow the run")
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 130 and out == "", err
    assert err.strip() == f"stopped waiting; run {run_id} goes on (chordflow cancel {run_id} to stop it)"
    assert record_status(run_id) == "running" and not RunState(run_id).cancelled()
    gate.touch()
    assert durable.wait(run_id, timeout=60).status == "success"  # the run went on to its end
    assert lines(log) == ["held"]


def test_status_of_a_running_cluster_batch_shows_its_done_total_and_failed(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    log, gate, open_ = tmp_path / "log", tmp_path / "gate", tmp_path / "open"
    open_.touch()
    items = [{"i": i, "gate": str(open_ if i < 10 else gate)} for i in range(40)]
    node = side_effect("b", log, label="${item.i}", gate="${item.gate}")
    node["batch"] = {"items": "${items}", "chunk_size": 5}
    run_id = durable.submit({"nodes": [node]}, {"items": items})
    counts = {"total": 40, "done": 10, "failed": 0}  # items 10 on wait for the gate
    until(lambda: json.loads(cli(celery_cluster, "status", run_id, "--json").stdout)["batches"].get("b") == counts,
          60, "the first ten items' outcomes in status")  # fmt: skip
    text = cli(celery_cluster, "status", run_id).stdout
    assert f"run {run_id}: running" in text and "b: 10/40 items, 0 failed" in text, text
    gate.touch()
    assert durable.wait(run_id, timeout=60).status == "success"
    assert json.loads(cli(celery_cluster, "status", run_id, "--json").stdout)["batches"]["b"]["done"] == 40


def test_results_node_streams_a_cluster_batch_from_its_stored_chunks(celery_cluster: Cluster, tmp_path: Path) -> None:
    total = 500
    batch = {"id": "b", "type": "test-fail", "params": {"value": "${item}", "fail_on": 7},
             "batch": {"items": "${items}", "error_handling": "continue", "chunk_size": 40}}  # fmt: skip
    run_id = durable.submit({"nodes": [batch]}, {"items": [i % 100 for i in range(total)]})
    assert durable.wait(run_id, timeout=60).status == "success"
    chunks = ClusterRuns().redis.hlen(f"cf:{{{run_id}}}:chunks:b#0")
    assert chunks == 13  # 500 items in chunks of 40: what the rows are read from

    out = tmp_path / "rows.jsonl"
    written = cli(celery_cluster, "results", run_id, "--node", "b", "--out", out)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(total))
    failed = [i for i in range(total) if i % 100 == 7]
    assert [r["index"] for r in rows if r["error"]] == failed
    assert all(r["result"] == {"value": i % 100} for i, r in enumerate(rows) if i not in failed)
    assert rows[7]["result"] is None and "7" in rows[7]["error"]

    errors = cli(celery_cluster, "results", run_id, "--node", "b", "--errors", "--format", "json")
    assert [r["index"] for r in json.loads(errors.stdout)] == failed
    unknown = tmp_path / "nope.jsonl"
    assert_one_line_error(cli(celery_cluster, "results", run_id, "--node", "nope", "--out", unknown), 2)
    assert not unknown.exists()  # nothing half-written


def test_submit_reads_an_inputs_file_into_the_run_and_input_pairs_win(celery_cluster: Cluster, tmp_path: Path) -> None:
    batch = {"id": "b", "type": "echo", "params": {"v": "${item}", "tag": "${tag}"}, "batch": {"items": "${items}"}}
    wf = write_wf(tmp_path, {"inputs": {"items": {}, "tag": {}, "size": {"default": 3, "required": False}},
                             "nodes": [batch]})  # fmt: skip
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"items": [1, "two", {"three": [3.0]}, None], "tag": "from-file"}))
    submitted = cli(celery_cluster, "submit", wf, "--inputs-file", inputs, "--input", "tag=from-cli")
    assert submitted.returncode == 0, submitted.stderr
    result = durable.wait(submitted.stdout.strip(), timeout=60)
    assert [r["v"] for r in result.shared["b"]["results"]] == [1, "two", {"three": [3.0]}, None]
    assert {r["tag"] for r in result.shared["b"]["results"]} == {"from-cli"}
    assert result.shared["size"] == 3  # a declared default still applies
    on_cluster = cli(celery_cluster, "run", wf, "--inputs-file", inputs, "--backend", "celery", "--output", "json")
    assert json.loads(on_cluster.stdout)["store"]["b"]["count"] == 4, on_cluster.stderr

    inputs.write_text(json.dumps({"itemz": [1], "tag": "t"}))
    line = assert_one_line_error(cli(celery_cluster, "submit", wf, "--inputs-file", inputs), 2)
    assert "unknown input 'itemz' (did you mean 'items'?)" in line
    inputs.write_text('{"items": [1,\n ]}')
    line = assert_one_line_error(cli(celery_cluster, "submit", wf, "--inputs-file", inputs), 2)
    assert line == f"error: --inputs-file {inputs}: invalid JSON at line 2, column 2: Expecting value"


def test_a_chunk_that_crashes_fails_the_cluster_run_instead_of_hanging(celery_cluster: Cluster) -> None:
    """Not an item failure: the chunk's outcomes cannot travel back, so the chord body never runs; its error
    callback must end the run (nobody waits on the chord)."""
    wf = {"nodes": [{"id": "b", "type": "test-unencodable", "batch": {"items": "${items}"}}]}
    run_id = scheduler.submit(wf, {"items": [1, 2, 3]})
    result = scheduler.wait(run_id, timeout=60)
    assert result.status == "failed", result
    assert "batch node 'b': a chunk failed on a worker" in result.error and "cannot travel" in result.error
    assert scheduler.status(run_id)["node"] == "b"


@pytest.mark.processes
def test_submit_without_workers_says_the_run_waits_and_the_run_stays_queued(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, plugins=PLUGINS)  # Redis only: no worker at all
    try:
        wf = write_wf(tmp_path, {"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]})
        proc = cli(cluster, "submit", wf)
        assert proc.returncode == 0, proc.stderr
        run_id = proc.stdout.strip()
        assert proc.stderr.strip() == (
            f"warning: no chordflow worker is registered; run {run_id} waits in the queue until one starts"
        )
        assert json.loads(cli(cluster, "status", run_id, "--json").stdout)["status"] == "queued"
        assert cli(cluster, "wait", run_id, "--timeout", "0.5").returncode == 124
    finally:
        cluster.stop()
