"""Checkpoints after every node, the step limit, resume of local runs, and the run commands.

Side effects are counted in files, so "not executed again" is a fact on disk, not a mock's say-so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import StepLimitExceeded
from scheduler.api import cached_nodes
from tests.scheduler.cli.test_cli import ROOT, assert_one_line_error, cli_env, run_cli
from worker.engine.stepper import run_step
from worker.runs.sqlite import LocalRuns


def side_effect(node_id: str, log: Path, **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "test-side-effect", "params": {"log": str(log), "label": node_id, **params}}


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def until(condition: Callable[[], Any], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s"
        time.sleep(0.05)
    return value


def endless(max_steps: int | None = None) -> dict[str, Any]:
    """a <-> b forever: b's only way out is an action it never returns (validation warns, does not fail)."""
    wf: dict[str, Any] = {
        "nodes": [{"id": n, "type": "echo", "params": {"v": n}} for n in ("a", "b", "c")],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "a"}, {"from": "b", "to": "c", "action": "done"}],
    }
    if max_steps:
        wf["max_steps"] = max_steps
    return wf


def test_step_limit_names_the_loop_and_the_limit(backend: str) -> None:
    with pytest.raises(StepLimitExceeded, match=r"after 40 steps \(max_steps\): the nodes a -> b -> a kept looping"):
        scheduler.run(endless(40), backend=backend)


def test_step_limit_default_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_MAX_STEPS", "25")
    with pytest.raises(StepLimitExceeded, match="after 25 steps"):
        scheduler.run(endless())
    assert scheduler.run(endless(1000) | {"edges": [{"from": "a", "to": "b"}]}).status == "success"


@pytest.mark.processes
def test_cli_step_limit_is_one_line_exit_1(tmp_path: Path) -> None:
    wf = tmp_path / "loop.json"
    wf.write_text(json.dumps(endless(30)))
    proc = run_cli("run", wf)
    line = assert_one_line_error(proc, 1)
    assert line == "error: run stopped after 30 steps (max_steps): the nodes a -> b -> a kept looping"


def test_stream_reports_a_node_failure_once_and_final_like_run_result() -> None:
    wf = {
        "nodes": [
            {"id": "ok", "type": "echo", "params": {"v": 1}},
            {"id": "boom", "type": "test-fail", "params": {"fail": True}},
        ]
    }
    events = list(scheduler.stream(wf))
    errors = [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["node"] == "boom", errors
    final = events[-1]
    assert final["type"] == "final" and final["status"] == "failed" and final["error"] and final["run_id"]
    assert final["outputs"] == {}
    good = {"nodes": [{"id": "e", "type": "echo", "params": {"v": 7}}], "outputs": {"v": {"source": "${e.v}"}}}
    final = list(scheduler.stream(good))[-1]
    assert (final["status"], final["outputs"], final["error"]) == ("success", {"v": 7}, None)
    assert LocalRuns.default().get(final["run_id"]).status == "succeeded"


def test_checkpoint_holds_only_the_keys_a_node_changed() -> None:
    flow = scheduler.compile({"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]})
    big = list(range(100_000))
    store = {"big": big, "other": {"x": 1}}
    step = run_step(flow, "e", store)
    assert set(step.changed) == {"e"} and step.next_node is None and store["big"] is big


def test_failed_local_run_resumes_without_rerunning_completed_nodes(tmp_path: Path) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    wf = {"nodes": [side_effect("n1", log), side_effect("n2", log, requires=str(gate)), side_effect("n3", log)]}
    with pytest.raises(FileNotFoundError):
        scheduler.run(wf, run_id="resume-local-1")
    record = LocalRuns.default().get("resume-local-1")
    assert (record.status, record.node, record.step) == ("failed", "n2", 1)
    gate.touch()  # the cause is fixed
    result = scheduler.resume("resume-local-1")
    assert result.status == "success" and result.shared["n3"] == {"label": "n3"}
    assert lines(log) == ["n1", "n2", "n3"]  # n1 ran once
    assert LocalRuns.default().get("resume-local-1").status == "succeeded"


def test_cancelled_batch_resumes_only_the_items_without_an_outcome(tmp_path: Path) -> None:
    log = tmp_path / "log"
    node = side_effect("b", log, label="${item}")
    node["batch"] = {"items": "${items}"}
    wf = {"nodes": [node]}
    cancelled = threading.Event()

    def cancel_after_five(event: dict[str, Any]) -> None:
        if event["type"] == "batch_progress" and event["done"] == 5:
            cancelled.set()

    first = scheduler.run(wf, {"items": list(range(20))}, on_event=cancel_after_five, cancelled=cancelled)
    assert first.status == "cancelled"
    assert lines(log) == [str(i) for i in range(5)]
    result = scheduler.resume(first.run_id)
    assert result.status == "success"
    assert [r["label"] for r in result.shared["b"]["results"]] == [str(i) for i in range(20)]
    assert sorted(map(int, lines(log))) == list(range(20))  # every item executed exactly once overall


@pytest.mark.processes
def test_cli_run_status_runs_resume(tmp_path: Path) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    wf = tmp_path / "wf.json"
    wf.write_text(
        json.dumps({"name": "three", "nodes": [side_effect("n1", log), side_effect("n2", log, requires=str(gate))]})
    )
    assert run_cli("run", wf).returncode == 1
    listed = json.loads(run_cli("runs", "--status", "failed", "--limit", "1", "--json").stdout)
    run_id = listed[0]["run_id"]
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert {k: status[k] for k in ("status", "node", "steps", "workflow")} == {
        "status": "failed", "node": "n2", "steps": 1, "workflow": "three",
    }  # fmt: skip
    assert "FileNotFoundError" in status["error"]
    gate.touch()
    resumed = run_cli("resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "↻ cached n1" in resumed.stderr and "status: success" in resumed.stdout
    assert lines(log) == ["n1", "n2"]
    assert cached_nodes(run_id) == ["n1", "n2"]
    assert_one_line_error(run_cli("resume", run_id), 2)  # a succeeded run does not resume
    assert_one_line_error(run_cli("status", "nosuchrun"), 2)


@pytest.mark.processes
def test_cli_wait_follows_a_local_run_in_another_process(tmp_path: Path) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [side_effect("n1", log), side_effect("n2", log, gate=str(gate))]}))
    running = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "run", str(wf)], cwd=ROOT, env=cli_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        runs = LocalRuns.default()
        found = until(lambda: [r.run_id for r in runs.recent("running", 50) if str(gate) in str(r.workflow)])
        run_id = found[0]
        assert run_cli("wait", run_id, "--timeout", "0.3").returncode == 124  # n2 waits for its gate
        waiting = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "wait", run_id], cwd=ROOT, env=cli_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        gate.touch()
        out, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert "status: success" in out
        assert running.wait(timeout=60) == 0
    finally:
        running.kill()
    assert lines(log) == ["n1", "n2"]


@pytest.mark.processes
def test_cli_results_outputs_store_and_batch_items(tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    node = {"id": "b", "type": "test-fail", "params": {"value": "${item}", "fail_on": 2},
            "batch": {"items": "${items}", "error_handling": "continue"}}  # fmt: skip
    wf.write_text(json.dumps({"nodes": [node], "outputs": {"n": {"source": "${b.count}"}}}))
    report = json.loads(run_cli("run", wf, "--input", "items=[0,1,2,3]", "--output", "json").stdout)
    run_id = report["run_id"]
    assert json.loads(run_cli("results", run_id).stdout) == {"n": 4}
    assert json.loads(run_cli("results", run_id, "--store").stdout)["items"] == [0, 1, 2, 3]
    rows = [json.loads(line) for line in run_cli("results", run_id, "--node", "b").stdout.splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3]
    assert [r["error"] is None for r in rows] == [True, True, False, True]
    assert rows[1]["result"] == {"value": 1}
    out = tmp_path / "errors.jsonl"
    assert run_cli("results", run_id, "--node", "b", "--errors", "--out", out).returncode == 0
    assert [json.loads(line)["index"] for line in out.read_text().splitlines()] == [2]
    assert_one_line_error(run_cli("results", run_id, "--node", "nope"), 2)
