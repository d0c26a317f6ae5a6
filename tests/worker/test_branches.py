"""Parallel branches with a fan-in, on both backends, through `run` and `stream`.

The `backend` fixture runs each behaviour locally and with batches on the suite's cluster (real
redis-server and workers); side effects are counted in files.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import ir
import scheduler
from scheduler import api, durable
from tests.scheduler.test_durable import VISIBILITY_TIMEOUT, until
from tests.support.cluster import destroyable_cluster
from worker.cluster.state.runstate import RunState
from worker.runs.sqlite import LocalRuns

ROOT = Path(__file__).parents[2]


def log_node(node_id: str, log: Path, **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "test-side-effect", "params": {"log": str(log), "label": node_id, **params}}


def fork(branches: list[str], fan_in: str = "merge", **extra: Any) -> list[dict[str, Any]]:
    return [{"from": "start", "to": b, "parallel": True, "fan_in": fan_in, **extra} for b in branches]


def section_workflow(tmp_path: Path, *, fail: tuple[str, ...] = (), **edge_extra: Any) -> dict[str, Any]:
    """start -> {a -> a2, b, c} -> merge -> end; branch nodes in `fail` raise (they require a missing file)."""
    log = tmp_path / "log"
    missing = tmp_path / "missing"

    def node(node_id: str) -> dict[str, Any]:
        extra = {"requires": str(missing)} if node_id in fail else {}
        return log_node(node_id, log, **extra)

    return {
        "nodes": [node(n) for n in ("start", "a", "a2", "b", "c")]
        + [
            {"id": "merge", "type": "echo", "params": {"results": "${__parallel_results__}", "a2": "${a2.label}"}},
            {"id": "end", "type": "echo", "params": {"done": True}},
        ],
        "edges": [
            *fork(["a", "b", "c"], **edge_extra),
            {"from": "a", "to": "a2"},
            {"from": "a2", "to": "merge"},
            {"from": "b", "to": "merge"},
            {"from": "c", "to": "merge"},
            {"from": "merge", "to": "end"},
        ],
    }


def logged(tmp_path: Path) -> list[str]:
    log = tmp_path / "log"
    return log.read_text().splitlines() if log.exists() else []


# -- validation ---------------------------------------------------------------------------------------------


def problems_of(wf: dict[str, Any]) -> str:
    with pytest.raises(ir.ValidationError) as raised:
        ir.load(wf)
    return str(raised.value)


def three_nodes(*extra_nodes: str) -> list[dict[str, Any]]:
    return [{"id": n, "type": "echo"} for n in ("start", "a", "b", "merge", *extra_nodes)]


def test_a_fan_in_that_does_not_exist_is_named() -> None:
    wf = {"nodes": three_nodes(), "edges": [*fork(["a", "b"], fan_in="mrege"), {"from": "a", "to": "merge"}]}
    assert "edges[0].fan_in: unknown node 'mrege'" in problems_of(wf)


def test_a_branch_that_never_reaches_its_fan_in_is_named_with_the_fan_in() -> None:
    wf = {"nodes": three_nodes(), "edges": [*fork(["a", "b"]), {"from": "a", "to": "merge"}]}
    assert "edges[1]: branch 'b' never reaches its fan-in 'merge'" in problems_of(wf)


def test_a_branch_reaching_another_branchs_nodes_is_refused() -> None:
    wf = {
        "nodes": three_nodes("x"),
        "edges": [*fork(["a", "b"]), {"from": "a", "to": "x"}, {"from": "b", "to": "x"}, {"from": "x", "to": "merge"}],
    }
    assert "branch 'b' reaches node 'x' of branch 'a'" in problems_of(wf)


def test_parallel_edges_of_one_node_must_name_one_fan_in() -> None:
    wf = {
        "nodes": three_nodes("other"),
        "edges": [
            {"from": "start", "to": "a", "parallel": True, "fan_in": "merge"},
            {"from": "start", "to": "b", "parallel": True, "fan_in": "other"},
            {"from": "a", "to": "merge"},
            {"from": "b", "to": "other"},
        ],
    }
    assert "parallel edges from 'start' name different fan-ins (merge, other)" in problems_of(wf)


def test_a_parallel_edge_needs_a_fan_in_and_a_valid_error_mode() -> None:
    wf = {"nodes": three_nodes(), "edges": [{"from": "start", "to": "a", "parallel": True}]}
    assert 'edges[0]: a parallel edge needs "fan_in"' in problems_of(wf)
    wf["edges"] = [*fork(["a"], fan_in_error_handling="later"), {"from": "a", "to": "merge"}]
    assert "fan_in_error_handling must be 'fail_fast' or 'continue', got 'later'" in problems_of(wf)


@pytest.mark.processes
def test_chordflow_validate_reports_parallel_problems_in_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps({"nodes": three_nodes(), "edges": [*fork(["a", "b"]), {"from": "a", "to": "merge"}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "validate", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "branch 'b' never reaches its fan-in 'merge'" in proc.stderr and "Traceback" not in proc.stderr


# -- execution ----------------------------------------------------------------------------------------------


def test_the_fan_in_sees_every_branch_in_declaration_order(backend: str, tmp_path: Path) -> None:
    result = scheduler.run(section_workflow(tmp_path), backend=backend)
    assert result.status == "success"
    results = result.shared["__parallel_results__"]
    assert [r["branch"] for r in results] == ["a", "b", "c"]
    assert [r["ok"] for r in results] == [True, True, True]
    assert results[0]["state"] == {"a": {"label": "a"}, "a2": {"label": "a2"}}  # a branch of two nodes
    assert result.shared["merge"]["a2"] == "a2" and result.shared["b"] == {"label": "b"}
    assert sorted(logged(tmp_path)) == ["a", "a2", "b", "c", "start"]  # each node once


def test_two_branches(backend: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = {
        "nodes": [log_node(n, log) for n in ("start", "a", "b")] + [{"id": "merge", "type": "echo", "params": {}}],
        "edges": [*fork(["a", "b"]), {"from": "a", "to": "merge"}, {"from": "b", "to": "merge"}],
    }
    result = scheduler.run(wf, backend=backend)
    assert [r["branch"] for r in result.shared["__parallel_results__"]] == ["a", "b"]


def test_a_failing_branch_stops_alone_and_the_fan_in_runs_with_partial_results(backend: str, tmp_path: Path) -> None:
    events = list(scheduler.stream(section_workflow(tmp_path, fail=("b",)), backend=backend))
    errors = [e for e in events if e["type"] == "parallel_error"]
    assert [(e["branch"], e["node"]) for e in errors] == [("b", "b")] and "missing" in errors[0]["error"]
    final = events[-1]
    assert final["type"] == "final" and final["status"] == "success"
    results = final["state"]["__parallel_results__"]
    assert [r["ok"] for r in results] == [True, False, True]
    assert "FileNotFoundError" in results[1]["error"] and results[1]["state"] == {}
    assert "end" in final["state"]  # the flow went on past the fan-in


def test_every_branch_failing_still_runs_the_fan_in(backend: str, tmp_path: Path) -> None:
    wf = section_workflow(tmp_path, fail=("a", "b", "c"))
    wf["nodes"][5]["params"] = {"results": "${__parallel_results__}"}  # no branch wrote anything to read
    result = scheduler.run(wf, backend=backend)
    assert result.status == "success"
    assert [r["ok"] for r in result.shared["__parallel_results__"]] == [False, False, False]
    assert logged(tmp_path) == ["start"]


def test_fail_fast_fails_the_run_with_the_branch_error(backend: str, tmp_path: Path) -> None:
    wf = section_workflow(tmp_path, fail=("c",), fan_in_error_handling="fail_fast")
    with pytest.raises(FileNotFoundError, match="missing"):
        scheduler.run(wf, backend=backend)
    assert "merge" not in logged(tmp_path)


def test_events_per_branch_come_in_order_and_the_fan_in_after_every_branch(backend: str, tmp_path: Path) -> None:
    events = list(scheduler.stream(section_workflow(tmp_path), backend=backend))
    kinds = [e["type"] for e in events]
    assert set(kinds) >= {"state", "parallel_state", "branch_complete", "final"}
    by_branch = {
        b: [e["node"] for e in events if e["type"] == "parallel_state" and e["branch"] == b] for b in ("a", "b", "c")
    }
    assert by_branch == {"a": ["a", "a2"], "b": ["b"], "c": ["c"]}
    completes = [e["branch"] for e in events if e["type"] == "branch_complete"]
    assert sorted(completes) == ["a", "b", "c"]  # once per branch
    merge_at = next(i for i, e in enumerate(events) if e["type"] == "state" and e["node"] == "merge")
    last_branch_event = max(i for i, e in enumerate(events) if "branch" in e)
    assert last_branch_event < merge_at
    for b in ("a", "b", "c"):  # within a branch: its states, then its completion
        own = [i for i, e in enumerate(events) if e.get("branch") == b]
        assert events[own[-1]]["type"] == "branch_complete"
    run = scheduler.run(section_workflow(tmp_path), backend=backend)
    assert {k: v for k, v in events[-1]["state"].items()} == run.shared  # run and stream agree


def test_a_batch_node_inside_a_branch(backend: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = {
        "nodes": [
            {"id": "start", "type": "echo", "params": {"items": ["x", "y", "z"]}},
            {"id": "up", "type": "test-upper", "params": {"text": "${item}"}, "batch": {"items": "${start.items}"}},
            log_node("b", log),
            {"id": "merge", "type": "echo", "params": {"first": "${up.results[0].value}"}},
        ],
        "edges": [*fork(["up", "b"]), {"from": "up", "to": "merge"}, {"from": "b", "to": "merge"}],
    }
    events = list(scheduler.stream(wf, backend=backend))
    final = events[-1]["state"]
    assert [r["value"] for r in final["up"]["results"]] == ["X", "Y", "Z"]
    assert final["merge"]["first"] == "X"
    progress = [e for e in events if e["type"] == "batch_progress"]
    assert len(progress) == 3 and {e["branch"] for e in progress} == {"up"}


def test_root_keys_written_by_several_branches_are_taken_in_declaration_order(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wf = {
        "nodes": [
            {"id": "start", "type": "echo", "params": {}},
            {"id": "a", "type": "echo", "params": {"__shared__": "from a"}},
            {"id": "b", "type": "echo", "params": {"__shared__": "from b"}},
            {"id": "merge", "type": "echo", "params": {"seen": "${__shared__}"}},
        ],
        "edges": [*fork(["a", "b"]), {"from": "a", "to": "merge"}, {"from": "b", "to": "merge"}],
    }
    with caplog.at_level(logging.WARNING):
        result = scheduler.run(wf)
    assert result.shared["merge"]["seen"] == "from b"
    assert "root key '__shared__' is written by branches 'a', 'b'" in caplog.text


def test_closing_the_stream_early_cancels_every_branch(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = {
        "nodes": [
            log_node("start", log),
            log_node("a", log),
            log_node("b", log, seconds=0.5),
            log_node("b2", log),
            {"id": "merge", "type": "echo", "params": {}},
        ],
        "edges": [
            *fork(["a", "b"]),
            {"from": "a", "to": "merge"},
            {"from": "b", "to": "b2"},
            {"from": "b2", "to": "merge"},
        ],
    }
    events = scheduler.stream(wf)
    first = next(e for e in events if e["type"] == "parallel_state")
    assert first["branch"] == "a"
    events.close()  # the consumer stops while b still runs its node: b must not go on to b2
    assert not [t for t in threading.enumerate() if t.name.startswith("branch-")]
    assert "b2" not in logged(tmp_path)  # b (running or not yet started) went no further
    assert LocalRuns.default().recent(limit=1)[0].status == "cancelled"


def test_a_slow_consumer_holds_the_run_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(api, "STREAM_BUFFER", 3)
    log = tmp_path / "log"
    node = log_node("b", log, label="${item}")
    node["batch"] = {"items": "${start.items}"}
    wf = {"nodes": [{"id": "start", "type": "echo", "params": {"items": list(range(200))}}, node]}
    events = scheduler.stream(wf)
    next(events)
    time.sleep(1)  # room for a run that would not wait: it would finish its 200 items in far less
    assert len(logged(tmp_path)) <= 10
    assert sum(1 for _ in events) > 0
    assert len(logged(tmp_path)) == 200


def test_resume_does_not_run_a_finished_branch_again(tmp_path: Path) -> None:
    log, a_log = tmp_path / "log", tmp_path / "a_log"
    flag = tmp_path / "flag"
    wf = {
        "nodes": [
            log_node("start", log),
            log_node("a", a_log),
            log_node("b", log, gate=str(a_log), requires=str(flag)),  # starts once a has logged, then fails
            {"id": "merge", "type": "echo", "params": {}},
        ],
        "edges": [*fork(["a", "b"], fan_in_error_handling="fail_fast"), {"from": "a", "to": "merge"},
                  {"from": "b", "to": "merge"}],
    }  # fmt: skip
    store: dict[str, Any] = {}
    with pytest.raises(FileNotFoundError):
        scheduler.run(wf, shared=store)
    run_id = LocalRuns.default().recent(limit=1)[0].run_id
    flag.write_text("now")
    result = scheduler.resume(run_id)
    assert result.status == "success"
    assert a_log.read_text().splitlines() == ["a"]  # branch a finished before b failed: not run again
    assert logged(tmp_path) == ["start", "b"]  # b's failed attempt logged nothing
    assert [r["ok"] for r in result.shared["__parallel_results__"]] == [True, True]


# -- the cluster: each branch a cursor of its own -----------------------------------------------------------


def test_a_submitted_run_advances_each_branch_on_the_workers_and_joins_at_the_fan_in(
    broker: Any, tmp_path: Path
) -> None:
    wf = section_workflow(tmp_path, fail=("b",))
    batch = {
        "id": "c",
        "type": "test-upper",
        "params": {"text": "${item}"},
        "batch": {"items": "${xs}", "chunk_size": 2},
    }
    wf["nodes"][4] = batch  # branch c is a batch node: its own chord
    wf["nodes"][5]["params"]["c"] = "${c.count}"
    events: list[dict[str, Any]] = []
    run_id = durable.submit(wf, {"xs": ["p", "q", "r", "s", "t"]})
    result = durable.wait(run_id, timeout=120, on_event=events.append)
    assert result.status == "success"
    results = result.shared["__parallel_results__"]
    assert [(r["branch"], r["ok"]) for r in results] == [("a", True), ("b", False), ("c", True)]
    assert "FileNotFoundError" in results[1]["error"]
    assert [r["value"] for r in result.shared["c"]["results"]] == ["P", "Q", "R", "S", "T"]
    assert result.shared["merge"]["c"] == 5 and result.shared["end"] == {"done": True}
    assert sorted(logged(tmp_path)) == ["a", "a2", "start"]  # every node once; b failed before logging
    states = [(e["branch"], e["node"]) for e in events if e["type"] == "parallel_state"]
    assert ("a", "a") in states and ("a", "a2") in states and ("c", "c") in states
    assert states.index(("a", "a")) < states.index(("a", "a2"))  # within a branch: in execution order
    assert sorted(e["branch"] for e in events if e["type"] == "branch_complete") == ["a", "b", "c"]
    assert [e["branch"] for e in events if e["type"] == "parallel_error"] == ["b"]


def test_a_fail_fast_branch_fails_a_submitted_run_and_resume_runs_only_the_failed_branch(
    celery_cluster: Any, tmp_path: Path
) -> None:
    log, a_log, flag = tmp_path / "log", tmp_path / "a_log", tmp_path / "flag"
    wf = {
        "nodes": [
            log_node("start", log),
            log_node("a", a_log),
            log_node("b", log, gate=str(a_log), requires=str(flag)),
            {"id": "merge", "type": "echo", "params": {}},
        ],
        "edges": [*fork(["a", "b"], fan_in_error_handling="fail_fast"), {"from": "a", "to": "merge"},
                  {"from": "b", "to": "merge"}],
    }  # fmt: skip
    run_id = durable.submit(wf)
    with pytest.raises(FileNotFoundError, match="missing"):
        durable.wait(run_id, timeout=120)
    assert durable.status(run_id)["status"] == "failed"
    flag.write_text("now")
    durable.resume_cluster(run_id)
    result = durable.wait(run_id, timeout=120)
    assert result.status == "success"
    assert a_log.read_text().splitlines() == ["a"]  # the finished branch was not run again
    assert logged(tmp_path) == ["start", "b"]
    assert [r["ok"] for r in result.shared["__parallel_results__"]] == [True, True]


@pytest.mark.processes
def test_run_stream_prints_json_lines_of_every_branch(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(section_workflow(tmp_path)))
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "run", str(path), "--stream"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    assert events[0] == {"type": "state", "node": "start", "state": {"start": {"label": "start"}}}
    assert {e["branch"] for e in events if e["type"] == "branch_complete"} == {"a", "b", "c"}
    assert events[-1]["type"] == "final" and events[-1]["status"] == "success"


def branch_completed(state: RunState, branch: str) -> bool:
    _, events = state.read_branch_events("0")
    return any(e["type"] == "branch_complete" and e["branch"] == branch for e in events)


@pytest.mark.processes
def test_workers_killed_mid_branch_then_new_workers_finish_the_section(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = {
        "nodes": [
            log_node("start", log),
            log_node("a", log, seconds=3),  # killed mid-way: it runs again
            log_node("b", log),
            {"id": "merge", "type": "echo", "params": {}},
        ],
        "edges": [*fork(["a", "b"]), {"from": "a", "to": "merge"}, {"from": "b", "to": "merge"}],
    }
    (tmp_path / "cluster").mkdir()
    with destroyable_cluster(tmp_path / "cluster", VISIBILITY_TIMEOUT) as cluster:
        run_id = durable.submit(wf)
        state = RunState(run_id)  # b's end is its branch_complete event: its log line comes before its checkpoint
        until(lambda: branch_completed(state, "b"), 60, "branch b to finish while a still runs")
        for worker in cluster.workers.values():
            worker.kill(signal.SIGKILL)
        assert "a" not in logged(tmp_path)
        cluster.start_worker("k3")
        cluster.start_worker("k4")
        result = durable.wait(run_id, timeout=120)
    assert result.status == "success"
    assert sorted(logged(tmp_path)) == ["a", "b", "start"]  # a once (its first run was cut off), b not again
    assert [r["ok"] for r in result.shared["__parallel_results__"]] == [True, True]


# -- what the CLI says of a failed branch ------------------------------------------------------------


def cli_run(tmp_path: Path, wf: dict[str, Any], backend: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "run", str(path), "--backend", backend],
        cwd=ROOT, env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.mark.processes
def test_a_run_whose_branch_failed_says_so_under_its_success_status(backend: str, tmp_path: Path) -> None:
    done = cli_run(tmp_path, section_workflow(tmp_path, fail=("b",)), backend)
    assert done.returncode == 0, done.stderr
    status, branch = done.stdout.splitlines()[:2]
    assert status.startswith("status: success")
    missing = tmp_path / "missing"
    assert branch == f"  branch 'b' failed: FileNotFoundError: missing {missing} (the fan-in ran without it)"


@pytest.mark.processes
def test_a_run_failing_at_the_fan_in_shows_the_failed_branchs_own_error_first(backend: str, tmp_path: Path) -> None:
    done = cli_run(tmp_path, section_workflow(tmp_path, fail=("a2",)), backend)
    assert done.returncode == 1
    first, second = done.stderr.splitlines()[-2:]
    assert first == f"error: branch 'a' failed: FileNotFoundError: missing {tmp_path / 'missing'}", done.stderr
    assert second.startswith("error: TemplateError: node 'merge' param 'a2': cannot resolve ${a2.label}"), second


@pytest.mark.processes
def test_a_failed_fan_in_and_a_failed_node_read_alike_in_run_status_and_status_json(
    backend: str, tmp_path: Path
) -> None:
    """One error text per failure on both backends, in `run` (its error line and its JSON report), `status` and
    `status --json`: a node's error names the node; a fail_fast fan-in's is the failed branch's own error (no
    `(node 'start:parallel')`: that section is no node of the workflow)."""
    missing = tmp_path / "missing"
    fan_in = section_workflow(tmp_path, fail=("c",), fan_in_error_handling="fail_fast")
    plain = {"nodes": [log_node("a", tmp_path / "log"), log_node("b", tmp_path / "log", requires=str(missing))],
             "edges": [{"from": "a", "to": "b"}]}  # fmt: skip
    for wf, expected in (
        (fan_in, f"FileNotFoundError: missing {missing}"),
        (plain, f"FileNotFoundError: missing {missing} (node 'b')"),
    ):
        path = tmp_path / "wf.json"
        path.write_text(json.dumps(wf))
        done = subprocess.run(
            [sys.executable, "-m", "scheduler.cli", "run", str(path), "--backend", backend, "--output", "json"],
            cwd=ROOT, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        report = json.loads(done.stdout)
        assert (done.returncode, done.stderr.splitlines()[-1], report["error"]) == (1, f"error: {expected}", expected)
        shown, as_json = (
            subprocess.run([sys.executable, "-m", "scheduler.cli", "status", report["run_id"], *flag],
                           cwd=ROOT, env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True,
                           timeout=60).stdout
            for flag in ([], ["--json"])
        )  # fmt: skip
        assert f"  error: {expected}" in shown.splitlines(), shown
        assert json.loads(as_json)["error"] == expected
