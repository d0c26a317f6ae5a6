"""The repair flow and checkpoints that know what changed.

Side effects are counted in files (`test-side-effect` appends its label to a log): "n1 ran once" is a fact
on disk. Real runs, real checkpoints, real workers for the cluster case; the only stand-in is the LLM
generator's `fake` model, which answers from the prompt alone.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import ValidationError
from scheduler.api import cached_nodes
from scheduler.localcluster import Cluster
from scheduler.repair import Failure, RepairRequest, Runner, diagnose, register_generator, repair
from scheduler.repair.llm_generator import build_prompt, extract_ir, fake_answer
from tests.scheduler.cli.test_cli import run_cli
from tests.scheduler.test_durable import cli
from worker.cluster.state.runs import ClusterRuns
from worker.runs.sqlite import LocalRuns

MISSPELT = "${n2.lable}"


def side_effect(node_id: str, log: Path, **params: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "test-side-effect", "params": {"log": str(log), "label": node_id, **params}}


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def four_nodes(log: Path, third: str = MISSPELT) -> dict[str, Any]:
    """n1 -> n2 -> n3 -> n4; n3 reads `third` (by default a misspelt key of n2), n4 reads n3."""
    return {
        "nodes": [
            side_effect("n1", log),
            side_effect("n2", log),
            side_effect("n3", log, label=f"{third}+3"),
            side_effect("n4", log, label="${n3.label}+4"),
        ],
        "outputs": {"last": {"source": "${n4.label}"}},
    }


def failed_run(workflow: dict[str, Any], run_id: str) -> Failure:
    """Run `workflow` (it must fail) and return its failure, as `run --repair` sees it."""
    try:
        result = scheduler.run(workflow, run_id=run_id)
    except Exception as exc:
        return Failure.from_exception(exc, run_id, LocalRuns.default().get(run_id).node)
    assert result.status == "failed", result
    return Failure.from_error_line(result.error, run_id, LocalRuns.default().get(run_id).node)


# -- 1. checkpoints that know what changed ------------------------------------------------------------------


def test_edited_workflow_resumes_rerunning_only_the_changed_node_and_those_after(tmp_path: Path) -> None:
    log = tmp_path / "log"
    first = scheduler.run(four_nodes(log, "${n2.label}"), run_id="edit-local")
    assert first.status == "success" and lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]
    edited = four_nodes(log, "${n2.label}-edited")
    assert cached_nodes("edit-local", edited) == ["n1", "n2"]
    result = scheduler.resume("edit-local", workflow=edited)
    assert result.status == "success" and result.outputs == {"last": "n2-edited+3+4"}
    assert lines(log)[4:] == ["n2-edited+3", "n2-edited+3+4"]  # n1, n2 not again
    assert LocalRuns.default().trail("edit-local") == ["n1", "n2", "n3", "n4"]
    unchanged = scheduler.resume("edit-local", workflow=copy.deepcopy(edited))  # nothing changed: nothing runs
    assert unchanged.status == "success" and len(lines(log)) == 6


def test_a_changed_node_late_in_the_trail_keeps_every_node_before_it(tmp_path: Path) -> None:
    """A change to n4 alone (its retries, not its params) re-runs n4 only; a new edge re-routes from there."""
    log = tmp_path / "log"
    scheduler.run(four_nodes(log, "${n2.label}"), run_id="edit-late")
    edited = four_nodes(log, "${n2.label}")
    edited["nodes"][3]["max_retries"] = 2
    assert cached_nodes("edit-late", edited) == ["n1", "n2", "n3"]
    scheduler.resume("edit-late", workflow=edited)
    assert lines(log)[4:] == ["n2+3+4"]
    skip = four_nodes(log, "${n2.label}")  # n3 removed: n2 now leads to n4
    del skip["nodes"][2]
    skip["nodes"][2]["params"]["label"] = "${n2.label}+4"
    skip["nodes"][2]["max_retries"] = 2
    result = scheduler.resume("edit-late", workflow=skip)
    assert lines(log)[5:] == ["n2+4"] and result.outputs == {"last": "n2+4"}
    assert LocalRuns.default().trail("edit-late") == ["n1", "n2", "n4"]


def test_resume_rolls_the_store_back_to_before_the_changed_node() -> None:
    """Root accumulators and namespaces written from the changed node on are undone before it runs again:
    the resumed run's store is the one a fresh run of the edited workflow makes."""
    nodes = [{"id": f"q{i}", "type": "llm", "params": {"prompt": f"question {i}", "model": "fake"}} for i in range(4)]
    scheduler.run({"nodes": nodes}, run_id="rewind-store")
    edited = {"nodes": copy.deepcopy(nodes)}
    edited["nodes"][2]["params"]["prompt"] = "another question"
    resumed = scheduler.resume("rewind-store", workflow=edited)
    fresh = scheduler.run(edited)
    assert len(resumed.shared["__llm_calls__"]) == 4  # not 6: q2's and q3's first calls were undone
    assert resumed.shared == fresh.shared


@pytest.mark.processes
def test_cli_resume_with_workflow_shows_the_cached_nodes(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf, edited = tmp_path / "wf.json", tmp_path / "edited.json"
    wf.write_text(json.dumps(four_nodes(log, "${n2.label}")))
    edited.write_text(json.dumps(four_nodes(log, "${n1.label}")))
    report = json.loads(run_cli("run", wf, "--output", "json").stdout)
    resumed = run_cli("resume", report["run_id"], "--workflow", edited)
    assert resumed.returncode == 0, resumed.stderr
    assert "↻ cached n1" in resumed.stderr and "↻ cached n2" in resumed.stderr
    assert "↻ cached n3" not in resumed.stderr and "node 'n3' changed" in resumed.stderr
    assert lines(log)[4:] == ["n1+3", "n1+3+4"]


@pytest.mark.processes
def test_cli_resume_says_how_many_batch_items_come_from_the_checkpoint(tmp_path: Path) -> None:
    node = side_effect("b", tmp_path / "log", label="${item}")
    node["batch"] = {"items": "${items}"}
    cancelled = threading.Event()

    def cancel_after_five(event: dict[str, Any]) -> None:
        if event["type"] == "batch_progress" and event["done"] == 5:
            cancelled.set()

    items = {"items": list(range(20))}
    first = scheduler.run({"nodes": [node]}, items, on_event=cancel_after_five, cancelled=cancelled)
    assert first.status == "cancelled"
    resumed = run_cli("resume", first.run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "↻ cached 5 items of batch node b (from the checkpoint)" in resumed.stderr
    assert sorted(map(int, lines(tmp_path / "log"))) == list(range(20))


# -- 2. the repair flow ---------------------------------------------------------------------------------------


@pytest.mark.processes
def test_misspelt_key_is_repaired_and_completes_with_nodes_1_2_executed_once(tmp_path: Path) -> None:
    log, fixed = tmp_path / "log", tmp_path / "fixed.json"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(four_nodes(log)))
    proc = run_cli("run", wf, "--repair", "--repair-out", fixed)
    assert proc.returncode == 0, proc.stderr
    assert lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]  # n1 and n2 ran once: the repair resumed the run
    assert "status: success" in proc.stdout and "last = n2+3+4" in proc.stdout
    assert f'-        "label": "{MISSPELT}+3"' in proc.stderr  # the diff of the IR
    assert '+        "label": "${n2.label}+3"' in proc.stderr
    assert "repair: 2 nodes from the checkpoint: n1, n2" in proc.stderr
    assert json.loads(fixed.read_text()) == four_nodes(log, "${n2.label}")


@pytest.mark.processes
def test_without_repair_nothing_changes(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(four_nodes(log)))
    proc = run_cli("run", wf)
    assert proc.returncode == 1 and "repair" not in proc.stderr
    assert lines(log) == ["n1", "n2"]


@pytest.mark.parametrize(
    ("node", "why"),
    [
        ({"id": "sh", "type": "shell", "params": {"command": "echo broken >&2; exit 3"}}, "reported an error"),
        ({"id": "sh", "type": "test-fail", "params": {"fail": True}}, "raised from its own logic"),
    ],
    ids=["failing-shell-command", "node-raised"],
)
@pytest.mark.processes
def test_a_non_repairable_error_fails_at_once_without_a_repair_attempt(tmp_path: Path, node: Any, why: str) -> None:
    log = tmp_path / "log"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [side_effect("n1", log), node]}))
    proc = run_cli("run", wf, "--repair", "--repair-out", tmp_path / "fixed.json")
    assert proc.returncode == 1
    assert "repair: not repaired (unrepairable)" in proc.stderr and why in proc.stderr
    assert "attempt" not in proc.stderr and not (tmp_path / "fixed.json").exists()
    assert lines(log) == ["n1"]
    outcome = repair({"nodes": [side_effect("n1", log), node]}, failed_run({"nodes": [node]}, f"unrepairable-{why}"))
    assert (outcome.status, outcome.attempts) == ("unrepairable", 0)


@pytest.mark.processes
def test_repair_command_repairs_a_run_that_already_failed(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(four_nodes(log)))
    report = json.loads(run_cli("run", wf, "--output", "json").stdout)
    assert report["status"] == "failed"
    proc = run_cli("repair", report["run_id"], "--output", "json")
    assert proc.returncode == 0, proc.stderr
    repaired = json.loads(proc.stdout)
    assert (repaired["run_id"], repaired["status"]) == (report["run_id"], "success")
    assert repaired["outputs"] == {"last": "n2+3+4"}
    assert lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]
    again = run_cli("repair", report["run_id"])
    assert again.returncode == 2 and "only a failed run can be repaired" in again.stderr


@pytest.mark.processes
def test_workflow_that_never_ran_is_repaired_and_run(tmp_path: Path) -> None:
    """A misspelt node type and a misspelt node id fail validation: no run, no checkpoint; the repaired
    workflow (a param name misspelt against the type's declared params too) runs from the start."""
    log = tmp_path / "log"
    wf = four_nodes(log, "${n2.label}")
    wf["nodes"][1]["type"] = "test-side-efect"
    wf["nodes"][3]["params"]["label"] = "${n33.label}+4"
    wf["nodes"].append({"id": "sh", "type": "shell", "params": {"comand": "echo done"}})
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    proc = run_cli("run", path, "--repair", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "success" and report["store"]["sh"]["stdout"] == "done\n"
    assert lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]
    assert '+      "type": "test-side-effect"' in proc.stderr and '+        "command": "echo done"' in proc.stderr
    assert proc.stderr.count("repair: attempt") == 1  # a workflow that never ran is repaired everywhere at once
    assert "repair: 0 nodes from the checkpoint" not in proc.stderr  # there was none


def test_param_name_misspelt_against_the_declared_params_fails_validation_and_is_repaired(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = {"nodes": [side_effect("n1", log), {"id": "sh", "type": "shell", "params": {"comand": "echo done"}}]}
    with pytest.raises(ValidationError) as refused:
        scheduler.run(wf, run_id="param-name")
    assert "nodes[1] (id 'sh').params.comand: unknown param (did you mean 'command'?)" in str(refused.value)
    assert LocalRuns.default().get("param-name") is None and not log.exists()  # refused before anything ran
    outcome = repair(wf, Failure.from_exception(refused.value))
    assert outcome.repaired and outcome.workflow["nodes"][1]["params"] == {"command": "echo done"}
    assert outcome.cached == [] and lines(log) == ["n1"]


def test_three_failed_attempts_end_with_max_attempts_and_the_original_error(tmp_path: Path) -> None:
    """A plugin generator whose every proposal fails differently: three attempts, then the original error."""
    proposals: list[str] = []

    @register_generator("test-always-wrong")
    class AlwaysWrong:
        def generate(self, request: RepairRequest) -> dict[str, Any]:
            proposals.append(request.failure.error)
            return four_nodes(tmp_path / "log", "${n2.wrong" + str(len(proposals)) + "}")

    failure = failed_run(four_nodes(tmp_path / "log"), "max-attempts")
    outcome = repair(four_nodes(tmp_path / "log"), failure, generator="test-always-wrong")
    assert (outcome.status, outcome.attempts, len(proposals)) == ("max_attempts", 3, 3)
    assert outcome.failure == failure and MISSPELT in outcome.failure.error
    assert lines(tmp_path / "log") == ["n1", "n2"]  # every attempt resumed after n2


def test_the_same_error_twice_stops_the_loop(tmp_path: Path) -> None:
    @register_generator("test-irrelevant")
    class Irrelevant:
        def generate(self, request: RepairRequest) -> dict[str, Any]:
            return {**request.workflow, "description": f"attempt {request.attempt}"}

    failure = failed_run(four_nodes(tmp_path / "log"), "same-error")
    outcome = repair(four_nodes(tmp_path / "log"), failure, generator="test-irrelevant")
    assert (outcome.status, outcome.attempts) == ("unrepairable", 1)
    assert outcome.reason.startswith("the same error twice") and outcome.failure == failure


def test_llm_generator_repairs_with_the_fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_REPAIR_MODEL", "fake")
    log = tmp_path / "log"
    failure = failed_run(four_nodes(log), "llm-fake")
    request = RepairRequest(four_nodes(log), failure, Runner().store("llm-fake"))
    prompt = build_prompt(request)
    assert json.dumps(four_nodes(log), indent=2) in prompt and failure.error in prompt
    assert "n2.label" in prompt  # the keys available one level down the path that did not resolve
    assert extract_ir(fake_answer(prompt)) == four_nodes(log, "${n2.label}")
    outcome = repair(four_nodes(log), failure, generator="llm")
    assert outcome.repaired and outcome.result.outputs == {"last": "n2+3+4"} and outcome.cached == ["n1", "n2"]
    assert lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]


@pytest.mark.processes
def test_the_generator_is_chosen_by_environment_or_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(four_nodes(tmp_path / "log")))
    unknown = run_cli("run", wf, "--repair", "--repair-generator", "nope")
    assert unknown.returncode == 2 and "unknown generator 'nope'" in unknown.stderr
    monkeypatch.setenv("CHORDFLOW_REPAIR_GENERATOR", "llm")  # no model configured
    monkeypatch.delenv("CHORDFLOW_REPAIR_MODEL", raising=False)
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL", raising=False)
    from tests.scheduler.cli.test_cli import cli_env

    proc = run_cli("run", wf, "--repair", env=cli_env())
    assert proc.returncode == 1 and "the llm repair generator needs a model" in proc.stderr


def test_diagnose_tells_workflow_mistakes_from_failures_of_the_world() -> None:
    shell = {"id": "sh", "type": "shell", "params": {"comand": "ls"}}
    wf = {"nodes": [shell]}
    assert diagnose(Failure("ValueError: shell: param 'command' is required", "ValueError", "sh"), wf) is None
    assert diagnose(Failure("ValueError: bad row", "ValueError", "sh"), wf) is not None
    http = Failure.from_error_line("node 'get' returned 'error': HTTP 500 Internal Server Error", "r", "get")
    assert "reported an error" in diagnose(http, {"nodes": []})
    assert diagnose(Failure.from_error_line("TemplateError: node 'x' ...", "r", None), wf) is None


# -- the cluster ------------------------------------------------------------------------------------------------


def test_cluster_run_is_repaired_and_resumed_from_its_redis_checkpoint(celery_cluster: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(four_nodes(log)))
    proc = cli(celery_cluster, "run", wf, "--backend", "celery", "--repair", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "success" and report["outputs"] == {"last": "n2+3+4"}
    assert lines(log) == ["n1", "n2", "n2+3", "n2+3+4"]  # n1, n2 ran once, on the workers
    assert "repair: 2 nodes from the checkpoint: n1, n2" in proc.stderr
    runs = ClusterRuns()
    assert runs.trail(report["run_id"]) == ["n1", "n2", "n3", "n4"]
    assert ClusterRuns().get(report["run_id"]).workflow["nodes"][2]["params"]["label"] == "${n2.label}+3"
    edited = tmp_path / "edited.json"  # and an edit of the succeeded run: n3 and n4 again, on the workers
    edited.write_text(json.dumps(four_nodes(log, "${n1.label}")))
    resumed = cli(celery_cluster, "resume", report["run_id"], "--workflow", edited)
    assert resumed.returncode == 0 and "↻ cached n2" in resumed.stderr and "↻ cached n3" not in resumed.stderr
    waited = cli(celery_cluster, "wait", report["run_id"], "--output", "json")
    assert json.loads(waited.stdout)["outputs"] == {"last": "n1+3+4"}, waited.stderr
    assert lines(log)[4:] == ["n1+3", "n1+3+4"]
    assert runs.trail(report["run_id"]) == ["n1", "n2", "n3", "n4"]


def test_cluster_resume_rolls_the_redis_store_back_to_before_the_changed_node(celery_cluster: Cluster) -> None:
    from scheduler import durable

    nodes = [{"id": f"q{i}", "type": "llm", "params": {"prompt": f"question {i}", "model": "fake"}} for i in range(4)]
    run_id = durable.submit({"nodes": nodes})
    assert durable.wait(run_id, timeout=60).status == "success"
    edited = {"nodes": copy.deepcopy(nodes)}
    edited["nodes"][2]["params"]["prompt"] = "another question"
    durable.resume_cluster(run_id, workflow=edited)
    resumed = durable.wait(run_id, timeout=60)
    assert len(resumed.shared["__llm_calls__"]) == 4  # q2's and q3's first calls were undone in Redis
    assert resumed.shared == scheduler.run(edited).shared
    assert ClusterRuns().trail(run_id) == ["q0", "q1", "q2", "q3"]


@pytest.mark.processes
def test_the_repair_example_runs_as_its_readme_shows(tmp_path: Path) -> None:
    assert run_cli("run", "examples/repair/greeting.json").returncode == 1
    proc = run_cli("run", "examples/repair/greeting.json", "--repair", "--repair-out", tmp_path / "fixed.json")
    assert proc.returncode == 0, proc.stderr
    assert "greeting = Hello, Ada Lovelace!" in proc.stdout
    assert "repair: 2 nodes from the checkpoint: profile, greet" in proc.stderr
    assert "${profile.user.city}" in json.loads((tmp_path / "fixed.json").read_text())["nodes"][2]["params"]["prompt"]
