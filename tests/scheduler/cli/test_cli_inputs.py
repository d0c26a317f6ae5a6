"""Run inputs: nesting limits, unknown and missing `--input` keys, from the CLI and from Python."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import ValidationError
from tests.scheduler.cli.test_cli import assert_one_line_error, cli_env, run_cli, write_wf

FOLDER_WF = {
    "inputs": {"folder": {"description": "where the files are", "required": True}},
    "nodes": [{"id": "show", "type": "echo", "params": {"folder": "${folder}"}}],
}
OPEN_WF = {"nodes": [{"id": "show", "type": "echo", "params": {"v": 1}}]}
DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.processes
def test_an_inputs_file_nested_too_deep_is_a_usage_error(tmp_path: Path) -> None:
    inputs = tmp_path / "deep.json"
    inputs.write_text('{"a": ' + DEEP + "}", encoding="utf-8")
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, OPEN_WF), "--inputs-file", inputs), 2)
    assert line == f"error: {inputs}: nested deeper than 100 levels"


@pytest.mark.processes
def test_an_input_value_nested_too_deep_is_a_usage_error(tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, OPEN_WF), "--input", f"k={DEEP}"), 2)
    assert line == "error: --input k: nested deeper than 100 levels"


@pytest.mark.processes
def test_an_unknown_input_suggests_the_declared_one(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, FOLDER_WF), "--input", "foldr=/data")
    line = assert_one_line_error(proc, 2)
    assert line == "error: --input foldr=...: unknown input 'foldr' (did you mean 'folder'?)"


@pytest.mark.processes
def test_a_missing_required_input_says_how_to_pass_it(tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, FOLDER_WF)), 2)
    assert line == "error: inputs.folder: required input 'folder' was not given; pass --input folder=..."


@pytest.mark.processes
def test_a_workflow_without_declared_inputs_accepts_any_input(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, OPEN_WF), "--input", "anything=1", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["store"]["anything"] == 1


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.processes
def test_validate_debug_prints_the_traceback(tmp_path: Path, debug: bool) -> None:
    path = tmp_path / "nope.json"
    proc = run_cli("validate", path, *(["--debug"] if debug else []))
    assert proc.returncode == 2
    if debug:
        assert "Traceback (most recent call last)" in proc.stderr
        assert proc.stderr.rstrip().endswith(f"ValidationError: {path}: file not found")
    else:
        assert assert_one_line_error(proc, 2) == f"error: {path}: file not found"


# -- the same checks from Python -------------------------------------------------------------------------------


def test_run_rejects_an_unknown_input_with_a_did_you_mean() -> None:
    with pytest.raises(ValidationError) as info:
        scheduler.run(FOLDER_WF, {"foldr": "/data"})
    assert str(info.value) == "inputs: unknown input 'foldr' (did you mean 'folder'?)"


def test_run_rejects_an_input_value_nested_too_deep() -> None:
    deep: list = []
    inner = deep
    for _ in range(500):
        inner.append([])
        inner = inner[0]
    with pytest.raises(ValidationError, match=r"^inputs\.folder: nested deeper than 100 levels$"):
        scheduler.run(FOLDER_WF, {"folder": deep})


# -- inputs given to a workflow that declares none ---------------------------------------------------------------


def given_wf(tmp_path: Path) -> dict:
    """No declared inputs; a node `s` (so `${xs}` alone would suggest it), a batch over `${xs}` (its chunks load
    the recorded workflow on the workers), then a node that fails until the file `fix` exists (for a resume)."""
    batch = {"id": "b", "type": "echo", "params": {"v": "${item}", "all": "${xs}"}, "batch": {"items": "${xs}"}}
    fails = {"id": "late", "type": "test-side-effect",
             "params": {"log": str(tmp_path / "log"), "label": "${xs}", "requires": str(tmp_path / "fix")}}  # fmt: skip
    return {"nodes": [{"id": "s", "type": "echo", "params": {"v": "${xs}"}}, batch, fails]}


def test_an_input_given_to_a_workflow_without_declared_inputs_is_known_to_every_load(
    backend: str, tmp_path: Path
) -> None:
    wf = given_wf(tmp_path)
    run_id = uuid.uuid4().hex[:12]
    with pytest.raises(FileNotFoundError):  # the node's exception, raised again by `wait` for a cluster run
        if backend == "local":
            scheduler.run(wf, {"xs": [1, 2, 3]}, run_id=run_id)
        else:
            scheduler.wait(scheduler.submit(wf, {"xs": [1, 2, 3]}, run_id=run_id), timeout=90)
    assert scheduler.status(run_id)["status"] == "failed"  # at `late`: s and b ran, with ${xs} resolved
    (tmp_path / "fix").touch()
    if backend == "local":  # the recorded workflow is loaded again, without the run's inputs at hand
        resumed = scheduler.resume(run_id)
    else:
        scheduler.api.resume_cluster(run_id)
        resumed = scheduler.wait(run_id, timeout=90)
    assert resumed.status == "success"
    assert resumed.shared["s"]["v"] == [1, 2, 3]
    assert [r["v"] for r in resumed.shared["b"]["results"]] == [1, 2, 3]
    assert (tmp_path / "log").read_text() == "[1, 2, 3]\n"


@pytest.mark.processes
def test_cli_run_with_an_undeclared_input_on_both_backends(backend: str, tmp_path: Path, request: Any) -> None:
    wf = given_wf(tmp_path)
    (tmp_path / "fix").touch()
    env = cli_env()
    if backend == "celery":
        env.update(request.getfixturevalue("celery_cluster").env)
    path = write_wf(tmp_path, wf)
    proc = run_cli("run", path, "--input", "xs=[1,2,3]", "--backend", backend, "--output", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["status"] == "success"
    assert report["store"]["s"]["v"] == [1, 2, 3]
    submitted = run_cli("submit", path, "--input", "xs=[4]", env=env)
    if backend == "celery":
        assert submitted.returncode == 0, submitted.stderr
        assert scheduler.wait(submitted.stdout.strip(), timeout=90).shared["b"]["results"] == [{"v": 4, "all": [4]}]


@pytest.mark.processes
def test_a_misspelt_reference_to_a_given_input_still_gets_the_did_you_mean(tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "s", "type": "echo", "params": {"v": "${itmes}"}}]}
    proc = run_cli("run", write_wf(tmp_path, wf), "--input", "items=[1,2,3]")
    line = assert_one_line_error(proc, 2)
    assert line.endswith("params.v: ${itmes} refers to unknown node or input 'itmes' (did you mean 'items'?)")
    with pytest.raises(ValidationError, match=r"'itmes' \(did you mean 'items'\?\)"):
        scheduler.run(wf, {"items": [1]})


def test_a_run_given_undeclared_inputs_resumes_under_an_edited_workflow(backend: str, tmp_path: Path) -> None:
    wf, run_id = given_wf(tmp_path), uuid.uuid4().hex[:12]
    with pytest.raises(FileNotFoundError):
        if backend == "local":
            scheduler.run(wf, {"xs": [1, 2]}, run_id=run_id)
        else:
            scheduler.wait(scheduler.submit(wf, {"xs": [1, 2]}, run_id=run_id), timeout=90)
    edited = given_wf(tmp_path)  # as the user edits the file: no inputs declared; `late` no longer needs `fix`
    del edited["nodes"][2]["params"]["requires"]
    if backend == "local":
        resumed = scheduler.resume(run_id, workflow=edited)
    else:
        scheduler.api.resume_cluster(run_id, workflow=edited)
        resumed = scheduler.wait(run_id, timeout=90)
    assert resumed.status == "success"
    assert (tmp_path / "log").read_text() == "[1, 2]\n"
    assert scheduler.api.cached_nodes(run_id) == ["s", "b", "late"]
