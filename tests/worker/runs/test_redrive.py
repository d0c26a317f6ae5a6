"""`redrive RUN --node N`: a finished run's batch node runs its failed items again, its succeeded ones kept, then
the nodes after it, under the same run id (worker/runs/redrive.py), on both backends with real workers.

Items are file paths: an item fails while its file is missing (test-side-effect `requires`) and appends its label
to a log when it runs, so "not run again" is a fact on disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import ValidationError
from tests.scheduler.cli.test_cli import assert_one_line_error, run_cli, write_wf
from tests.scheduler.test_durable import lines, until
from worker.runs.record import RunResult


def workflow(tmp_path: Path) -> dict[str, Any]:
    """`b` (a batch over file paths, continue) between `first` and `after`, each logging what it runs."""
    log, around = tmp_path / "log", tmp_path / "around"
    params = {"log": str(log), "label": "${item}", "requires": "${item}"}
    batch = {"id": "b", "type": "test-side-effect", "params": params,
             "batch": {"items": "${items}", "error_handling": "continue", "chunk_size": 2}}  # fmt: skip
    side = {"type": "test-side-effect", "params": {"log": str(around)}}
    return {
        "nodes": [
            {"id": "first", **side, "params": {**side["params"], "label": "first"}},
            batch,
            {"id": "after", **side, "params": {**side["params"], "label": "after"}},
        ]
    }


def items(tmp_path: Path, count: int = 6) -> list[str]:
    """Paths of which the even ones exist: the odd ones fail until their file is made."""
    paths = [tmp_path / f"item{i}" for i in range(count)]
    for path in paths[::2]:
        path.touch()
    return [str(p) for p in paths]


def first_run(backend: str, wf: dict[str, Any], paths: list[str]) -> RunResult:
    if backend == "local":
        return scheduler.run(wf, {"items": paths})
    return scheduler.wait(scheduler.submit(wf, {"items": paths}), timeout=90)


def redrive(backend: str, run_id: str) -> RunResult:
    if backend == "local":
        result = scheduler.redrive(run_id, node="b")
        assert isinstance(result, RunResult)
        return result
    assert scheduler.redrive(run_id, node="b") == 3  # the failed items, handed to the workers
    return scheduler.wait(run_id, timeout=90)


def test_redrive_runs_only_the_failed_items_then_the_nodes_after(backend: str, tmp_path: Path) -> None:
    wf, paths = workflow(tmp_path), items(tmp_path)
    first = first_run(backend, wf, paths)
    assert first.status == "success"
    assert first.shared["b"]["error_count"] == 3
    assert [e["index"] for e in first.shared["b"]["errors"]] == [1, 3, 5]
    assert sorted(lines(tmp_path / "log")) == sorted(paths[::2])
    for path in paths[1::2]:
        Path(path).touch()  # the cause is fixed
    again = redrive(backend, first.run_id)
    assert again.run_id == first.run_id
    assert again.status == "success"
    aggregate = again.shared["b"]
    assert (aggregate["success_count"], aggregate["error_count"], aggregate["errors"]) == (6, 0, None)
    assert [r["label"] for r in aggregate["results"]] == paths  # kept and new outcomes, in input order
    assert sorted(lines(tmp_path / "log")) == sorted(paths)  # every item ran exactly once overall
    assert lines(tmp_path / "around") == ["first", "after", "after"]  # before: kept; after: runs again
    with pytest.raises(ValidationError, match=f"run {first.run_id}: batch node 'b' has no failed items"):
        scheduler.redrive(first.run_id, node="b")


def test_redrive_refuses_a_node_that_is_not_a_batch_node(backend: str, tmp_path: Path) -> None:
    wf, paths = workflow(tmp_path), items(tmp_path, 2)
    run_id = first_run(backend, wf, paths).run_id
    with pytest.raises(ValidationError, match=f"run {run_id} has no batch node 'after'"):
        scheduler.redrive(run_id, node="after")
    with pytest.raises(ValidationError, match=f"run {run_id} has no node 'nope'"):
        scheduler.redrive(run_id, node="nope")
    assert len(lines(tmp_path / "log")) == 1  # nothing ran again


def test_redrive_refuses_a_run_still_running(celery_cluster: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    wf = workflow(tmp_path)
    wf["nodes"][0]["params"]["gate"] = str(gate)
    run_id = scheduler.submit(wf, {"items": items(tmp_path, 2)})
    until(lambda: scheduler.status(run_id)["status"] == "running", 60, "the run to start")
    with pytest.raises(ValidationError, match=f"run {run_id} is running; only a finished run can be redriven"):
        scheduler.redrive(run_id, node="b")
    gate.touch()
    assert scheduler.wait(run_id, timeout=90).status == "success"


def test_redrive_refuses_a_run_a_client_drove_on_the_cluster(celery_cluster: Any, tmp_path: Path) -> None:
    run_id = scheduler.run(workflow(tmp_path), {"items": items(tmp_path, 2)}, backend="celery").run_id
    with pytest.raises(ValidationError, match=f"run {run_id} sent its batches to the cluster from the process"):
        scheduler.redrive(run_id, node="b")
    assert len(lines(tmp_path / "log")) == 1  # nothing ran again


@pytest.mark.processes
def test_cli_redrive_node_shows_what_it_keeps_and_refuses_in_one_line(tmp_path: Path) -> None:
    paths = items(tmp_path, 4)
    path = write_wf(tmp_path, workflow(tmp_path))
    first = run_cli("run", path, "--input", f"items={paths}".replace("'", '"'), "--output", "json")
    run_id = first.stdout.split('"run_id": "')[1].split('"')[0]
    for item in paths[1::2]:
        Path(item).touch()
    again = run_cli("redrive", run_id, "--node", "b")
    assert again.returncode == 0, again.stderr
    assert "↻ cached first" in again.stderr
    assert "↻ cached 2 items of batch node b" in again.stderr
    assert sorted(lines(tmp_path / "log")) == sorted(paths)
    line = assert_one_line_error(run_cli("redrive", run_id, "--node", "b"), 2)
    assert line == f"error: run {run_id}: batch node 'b' has no failed items to redrive"
