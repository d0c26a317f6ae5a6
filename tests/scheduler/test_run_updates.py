"""Changing a running run (`chordflow update RUN ...`, `scheduler.update`), with a real redis-server and real workers:
a lowered `max_concurrent` is held by the batch's permits within seconds (items in flight counted in Redis by the
test node), a threshold changed mid-batch stops the batch and is its verdict, the record keeps each change and when,
and bad values, unknown, ended and local runs are one-line errors."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path

import pytest

import scheduler
from ir.errors import BatchThresholdExceeded, ValidationError
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import assert_one_line_error
from tests.scheduler.test_durable import cli, side_effect, until, wait_progress
from worker.cluster.state.keys import run_key
from worker.cluster.state.runstate import client


def test_update_max_concurrent_1_on_a_running_parallel_batch_holds_within_5s(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    total, gauge = 400, f"gauge-{uuid.uuid4().hex}"
    node = {
        "id": "b",
        "type": "test-gauge",
        "params": {"key": gauge, "seconds": 0.05},
        "batch": {"items": "${items}", "parallel": True, "max_concurrent": 4},
    }
    redis = client()
    run_id = scheduler.submit({"nodes": [node]}, {"items": list(range(total))})
    until(lambda: int(redis.get(f"{gauge}:max") or 0) >= 4, 60, "4 items in flight at once before the update")
    proc = cli(celery_cluster, "update", run_id, "--max-concurrent", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"updated run {run_id}: max_concurrent=1"
    permits = run_key(run_id, "permits:b#0")
    until(
        lambda: redis.zcard(permits) <= 1 and int(redis.get(f"{gauge}:now") or 0) <= 1,
        5,
        "one permit held and at most one item in flight",
    )
    redis.set(f"{gauge}:max", 0)  # from here on: the highest count of items in flight
    result = scheduler.wait(run_id, timeout=120)
    assert result.status == "success"
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], len(aggregate["results"])) == (total, total, total)
    assert int(redis.get(f"{gauge}:max")) == 1  # items kept running, never two at once
    info = json.loads(cli(celery_cluster, "status", run_id, "--json").stdout)
    [change] = info["updates"]
    assert change["changes"] == {"max_concurrent": 1} and abs(change["at"] - time.time()) < 600
    text = cli(celery_cluster, "status", run_id).stdout
    assert re.search(r"updated \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: max_concurrent=1", text), text


def test_a_threshold_lowered_mid_batch_stops_the_batch_and_is_its_verdict(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    total = 400
    node = side_effect("b", tmp_path / "effects.log", seconds=0.05, requires=str(tmp_path / "never"))
    node["batch"] = {
        "items": "${items}",
        "error_handling": "continue",
        "chunk_size": 5,
        "tolerated_failure_count": 10**6,
    }
    run_id = scheduler.submit({"nodes": [node]}, {"items": list(range(total))})
    wait_progress(run_id, 10)  # every item fails; tolerated so far
    assert scheduler.update(run_id, tolerated_failure_count=3) == {"tolerated_failure_count": 3}
    with pytest.raises(BatchThresholdExceeded, match=r"tolerated 3$") as raised:
        scheduler.wait(run_id, timeout=120)
    failed = int(re.search(r"failed (\d+) of 400 items", str(raised.value)).group(1))
    assert 3 < failed < total  # judged by the new count, and stopped before the end of the batch
    assert scheduler.status(run_id)["updates"][0]["changes"] == {"tolerated_failure_count": 3}


def test_bad_values_unknown_ended_and_local_runs_are_one_line_errors(celery_cluster: Cluster, tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "g", "type": "test-side-effect", "params": {"log": str(tmp_path / "log"), "label": "g",
                                                                         "gate": str(tmp_path / "gate")}}]}  # fmt: skip
    run_id = scheduler.submit(wf)
    for args, says in [
        (["--max-concurrent", "0"], "max_concurrent must be an integer >= 1, got 0"),
        (["--tolerated-failure-percent", "150"], "tolerated_failure_percent must be a number from 0 to 100, got 150"),
        (["--tolerated-failure-count", "-1"], "tolerated_failure_count must be an integer >= 0, got -1"),
        (["--priority", "urgent"], "priority must be one of high, normal, low, got 'urgent'"),
        ([], "nothing to change"),
    ]:
        assert says in assert_one_line_error(cli(celery_cluster, "update", run_id, *args), 2)
    unknown = assert_one_line_error(cli(celery_cluster, "update", "nosuchrun", "--max-concurrent", "2"), 2)
    assert "unknown run 'nosuchrun'" in unknown
    assert scheduler.status(run_id)["updates"] == []  # nothing recorded by the refused ones
    assert scheduler.update(run_id, priority="high") == {"priority": "high"}
    assert client().hget(run_key(run_id, "run"), "priority") == b"high"  # the record's field the dispatch reads
    assert not client().exists(run_key(run_id, "overrides"))  # no batch limit changed
    (tmp_path / "gate").touch()
    assert scheduler.wait(run_id, timeout=60).status == "success"
    ended = assert_one_line_error(cli(celery_cluster, "update", run_id, "--max-concurrent", "2"), 2)
    assert f"run {run_id} already ended: succeeded" in ended
    local = scheduler.run({"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]})
    with pytest.raises(ValidationError, match="only a submitted run's limits can be changed"):
        scheduler.update(local.run_id, max_concurrent=2)


def test_overrides_lay_max_concurrent_on_every_batch_and_thresholds_on_continue_batches_only() -> None:
    from worker.batch import overrides

    changed = {"max_concurrent": 2, "tolerated_failure_count": 5}
    workflow = {
        "nodes": [
            {"id": "plain", "type": "echo"},
            {
                "id": "ff",
                "type": "echo",
                "batch": {"items": "${x}", "error_handling": "fail_fast", "max_concurrent": 9},
            },
            {"id": "c", "type": "echo", "batch": {"items": "${x}", "error_handling": "continue"}},
        ]
    }
    plain, ff, cont = overrides.apply_to_workflow(workflow, changed)["nodes"]
    assert plain == {"id": "plain", "type": "echo"}
    assert ff["batch"] == {"items": "${x}", "error_handling": "fail_fast", "max_concurrent": 2}  # IR: no threshold
    assert cont["batch"] == {**workflow["nodes"][2]["batch"], "max_concurrent": 2, "tolerated_failure_count": 5}
    assert workflow["nodes"][1]["batch"]["max_concurrent"] == 9  # the recorded workflow is never edited
    assert overrides.apply_to_workflow(workflow, {}) is workflow
    assert overrides.parse({b"max_concurrent": b"3", b"tolerated_failure_percent": b"2.5"}) == {
        "max_concurrent": 3, "tolerated_failure_percent": 2.5,
    }  # fmt: skip
    assert overrides.problems({"max_concurrent": True}) == ["max_concurrent must be an integer >= 1, got True"]
