"""Run inputs: nesting limits, unknown and missing `--input` keys, from the CLI and from Python."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import scheduler
from ir.errors import ValidationError
from tests.test_cli import assert_one_line_error, run_cli, write_wf

FOLDER_WF = {
    "inputs": {"folder": {"description": "where the files are", "required": True}},
    "nodes": [{"id": "show", "type": "echo", "params": {"folder": "${folder}"}}],
}
OPEN_WF = {"nodes": [{"id": "show", "type": "echo", "params": {"v": 1}}]}
DEEP = "[" * 5000 + "]" * 5000


def test_an_inputs_file_nested_too_deep_is_a_usage_error(tmp_path: Path) -> None:
    inputs = tmp_path / "deep.json"
    inputs.write_text('{"a": ' + DEEP + "}", encoding="utf-8")
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, OPEN_WF), "--inputs-file", inputs), 2)
    assert line == f"error: {inputs}: nested deeper than 100 levels"


def test_an_input_value_nested_too_deep_is_a_usage_error(tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, OPEN_WF), "--input", f"k={DEEP}"), 2)
    assert line == "error: --input k: nested deeper than 100 levels"


def test_an_unknown_input_suggests_the_declared_one(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, FOLDER_WF), "--input", "foldr=/data")
    line = assert_one_line_error(proc, 2)
    assert line == "error: --input foldr=...: unknown input 'foldr' (did you mean 'folder'?)"


def test_a_missing_required_input_says_how_to_pass_it(tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, FOLDER_WF)), 2)
    assert line == "error: inputs.folder: required input 'folder' was not given; pass --input folder=..."


def test_a_workflow_without_declared_inputs_accepts_any_input(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, OPEN_WF), "--input", "anything=1", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["store"]["anything"] == 1


@pytest.mark.parametrize("debug", [False, True])
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
