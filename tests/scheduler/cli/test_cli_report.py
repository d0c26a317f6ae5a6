"""How `chordflow run` renders values: the text summary and the `--output json` report agree."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.scheduler.cli.test_cli import assert_one_line_error, cli_env, run_cli, write_wf

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)

FRUIT_WF = {
    "nodes": [{"id": "n", "type": "echo", "params": {"fruit": ["\U0001f34e!"], "word": "café"}}],
    "outputs": {"fruit": {"source": "${n.fruit}"}, "word": {"source": "${n.word}"}},
}


def test_non_ascii_values_print_as_they_are_in_text_output(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, FRUIT_WF))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert '  fruit = ["\U0001f34e!"]' in lines
    assert "  word = café" in lines
    assert "\\u" not in proc.stdout


def test_non_ascii_values_print_as_they_are_in_json_output(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, FRUIT_WF), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    assert '"fruit": ["\U0001f34e!"]' in proc.stdout
    assert "\\u" not in proc.stdout
    assert json.loads(proc.stdout)["outputs"] == {"fruit": ["\U0001f34e!"], "word": "café"}


def _values_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "oddvalues.py").write_text(
        "import datetime\ndef odd():\n    return {'tags': {'b', 'a', 'c'}, 'day': datetime.date(2024, 1, 2)}\n",
        encoding="utf-8",
    )
    return cli_env(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))


ODD_WF = {
    "nodes": [{"id": "n", "type": "python", "params": {"function": "oddvalues:odd"}}],
    "outputs": {"odd": {"source": "${n.result}"}},
}


def test_values_json_cannot_hold_render_the_same_in_text_and_json(tmp_path: Path) -> None:
    env = _values_env(tmp_path)
    path = write_wf(tmp_path, ODD_WF)
    text = run_cli("run", path, env=env)
    assert text.returncode == 0, text.stderr
    assert '  odd = {"tags": ["a", "b", "c"], "day": "2024-01-02"}' in text.stdout.splitlines()
    proc = run_cli("run", path, "--output", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    expected = {"tags": ["a", "b", "c"], "day": "2024-01-02"}  # sets: sorted lists; other values: str()
    assert report["outputs"]["odd"] == expected
    assert report["store"]["n"]["result"] == expected


def test_a_validation_error_still_prints_one_report_without_a_run_id(tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "a", "type": "ecko"}]}
    proc = run_cli("run", write_wf(tmp_path, wf), "--output", "json")
    line = assert_one_line_error(proc, 2)
    report = json.loads(proc.stdout)
    assert report == {
        "run_id": None,
        "status": "failed",
        "error": line.removeprefix("error: "),
        "outputs": {},
        "store": {},
    }
