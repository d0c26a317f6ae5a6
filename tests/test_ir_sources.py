"""`ir.load` on input of any shape: one ValidationError, never a traceback; the CLI prints one `error:` line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ir
from tests.support import workflow
from tests.test_cli import run_cli


def _message(source) -> str:
    with pytest.raises(ir.ValidationError) as info:
        ir.load(source)
    return str(info.value)


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def test_workflow_nested_5000_deep_in_a_file(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"nodes": ' + "[" * 5000 + "]" * 5000 + "}")
    assert _message(path) == f"{path}: nested deeper than 100 levels"
    assert _message(path.read_text()) == "workflow JSON: nested deeper than 100 levels"


def test_param_nested_800_deep_in_a_dict() -> None:
    wf = workflow({"id": "a", "type": "echo", "params": {"p": _nested(800)}})
    assert _message(wf) == "workflow: nested deeper than 100 levels"
    assert ir.load(workflow({"id": "a", "type": "echo", "params": {"p": _nested(90)}})).nodes[0].id == "a"


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_text("  \n")
    assert _message(path) == f"{path}: the file is empty, expected a workflow JSON object"


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "wf.yaml"
    path.write_text("nodes:\n  - id: a\n    type: echo\n")
    assert _message(path) == f"{path}: workflows are JSON, not YAML"


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text("[1, 2]")
    assert _message(path) == f"{path}: the workflow must be a JSON object, got list"


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(b'{"nodes": "\xff"}')
    assert _message(path) == f"{path}: not UTF-8 text (byte 11: invalid start byte)"
    assert _message(b"\xff{}").startswith("workflow JSON: not UTF-8 text")


def test_long_string_that_is_not_a_path() -> None:
    message = _message("w" * 5000)
    assert message.startswith("cannot read 'wwww") and message.endswith("...: File name too long")
    assert len(message) < 200


def test_string_with_a_nul_byte() -> None:
    assert _message("a\0b") == "'a\\x00b': file not found"


def test_number_with_too_many_digits() -> None:
    text = json.dumps(workflow({"id": "a", "type": "echo"})).replace(
        '"echo"}', '"echo", "params": {"n": ' + "7" * 5000 + "}}"
    )
    assert _message(text).startswith("workflow JSON: invalid JSON: Exceeds the limit (4300 digits)")


def test_template_index_with_thousands_of_digits_names_node_and_param() -> None:
    wf = workflow(
        {"id": "a", "type": "echo"}, {"id": "b", "type": "echo", "params": {"v": "${a.x[" + "9" * 5000 + "]}"}}
    )
    assert (
        _message(wf)
        == "nodes[1] (id 'b').params.v: ${a.x[999999999999999999999999...}: list index with 5000 digits is too large"
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "the file is empty"),
        (b"nodes:\n  - id: a\n", "invalid JSON at line 1, column 1"),
        (b"[]", "the workflow must be a JSON object, got list"),
        (b"\x80\x81", "not UTF-8 text"),
        (b'{"nodes": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested deeper than 100 levels"),
        (b'{"nodes": [{"id": "b", "type": "echo", "params": {"v": "${a[' + b"9" * 5000 + b']}"}}]}', "list index"),
        (b'{"ir_version": {"a": 1}, "nodes": [{"id": "\\ud800", "type": "echo"}]}', "2 problems"),
    ],
)
def test_cli_validate_never_prints_a_traceback(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(content)
    proc = run_cli("validate", path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {path}: ") and expected in proc.stderr.splitlines()[0]


def test_cli_validate_long_argument_that_is_not_a_file() -> None:
    proc = run_cli("validate", "q" * 5000)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot read 'qqq")
