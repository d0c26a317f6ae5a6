"""`ir.load` on input of any shape: one ValidationError, never a traceback; the CLI prints one `error:` line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import ir
import scheduler
from ir.limits import MAX_DEPTH, problem_in
from tests.scheduler.cli.test_cli import run_cli
from tests.support import workflow


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
    path.write_text('{"nodes":\n ' + "[" * 5000 + "]" * 5000 + "}")
    assert _message(path) == f"{path}: nested deeper than 100 levels at line 2, column 101"
    assert _message(path.read_text()) == "workflow JSON: nested deeper than 100 levels at line 2, column 101"


def test_param_nested_800_deep_in_a_dict_names_the_param() -> None:
    wf = workflow({"id": "a", "type": "echo", "params": {"p": _nested(800)}})
    assert _message(wf) == "nodes[0] (id 'a').params.p: nested deeper than 100 levels"
    assert ir.load(workflow({"id": "a", "type": "echo", "params": {"p": _nested(90)}})).nodes[0].id == "a"


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("empty.json", "  \n", "the file is empty, expected a workflow JSON object"),
        ("wf.yaml", "nodes:\n  - id: a\n    type: echo\n", "workflows are JSON, not YAML"),
        ("wf.json", "[1, 2]", "the workflow must be a JSON object, got list"),
    ],
)
def test_a_file_that_is_no_workflow_object_is_named(tmp_path: Path, name: str, text: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert _message(path) == f"{path}: {problem}"


def test_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(b'{"nodes": "\xff"}')
    assert _message(path) == f"{path}: not UTF-8 text (byte 11: invalid start byte)"
    assert _message(b"\xff{}").startswith("workflow JSON: not UTF-8 text")


def test_a_file_deep_in_directories_is_named_whole(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["a-rather-long-directory-name"] * 4)
    deep.mkdir(parents=True)
    path = deep / "broken.json"
    path.write_text('{"nodes": [\n  {"id": "a", "type": "echo",}\n]}')
    assert len(str(path)) > 120
    with pytest.raises(ir.ValidationError) as raised:
        ir.load(path)
    assert str(raised.value).startswith(f"{path}: invalid JSON at line 2, column 30")


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
@pytest.mark.processes
def test_cli_validate_never_prints_a_traceback(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(content)
    proc = run_cli("validate", path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: {path}: ") and expected in proc.stderr.splitlines()[0]


@pytest.mark.processes
def test_cli_validate_long_argument_that_is_not_a_file() -> None:
    proc = run_cli("validate", "q" * 5000)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot read 'qqq")


# -- bad documents found by probing, each a ValidationError naming where -----------------------------------------------


def _deep_list(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("batch", "where"),
    [
        ({"items": _nested(1000)}, "nodes[0] (id 'a').batch.items"),
        ({"items": "${x}", "as": _deep_list(1000)}, "nodes[0] (id 'a').batch.as"),
        ({"items": "${x}", "max_concurrent": _deep_list(2000)}, "nodes[0] (id 'a').batch.max_concurrent"),
    ],
)
def test_batch_fields_nested_1000_deep(batch: dict, where: str) -> None:
    assert _message(workflow({"id": "a", "type": "echo", "batch": batch})) == f"{where}: nested deeper than 100 levels"


def test_a_dict_inside_itself_names_where() -> None:
    params: dict = {"q": 1}
    params["self"] = params
    assert _message(workflow({"id": "a", "type": "echo", "params": {"p": params}})) == (
        "nodes[0] (id 'a').params.p: a value contains itself"
    )
    metadata: list = []
    metadata.append(metadata)
    assert _message(workflow({"id": "a", "type": "echo"}, metadata={"m": metadata})) == (
        "metadata.m[0]: a value contains itself"
    )


def test_a_workflow_object_built_without_load_is_checked_for_depth() -> None:
    wf = ir.Workflow(nodes=[ir.NodeSpec(id="a", type="echo", params={"p": _nested(3000)})])
    assert _message(wf) == "nodes[0] (id 'a').params.p: nested deeper than 100 levels"


def test_nodes_given_as_a_generator_or_a_set_are_checked_like_a_list() -> None:
    deep_node = {"id": "a", "type": "echo", "params": {"p": _nested(3000)}}
    assert _message({"nodes": (n for n in [deep_node])}) == "nodes[0] (id 'a').params.p: nested deeper than 100 levels"
    assert _message({"nodes": {1, 2}}).startswith("2 problems:\n  - nodes[0]: Input should be a valid dictionary")


def test_deep_tuple_keys_are_checked_before_anything_prints_them() -> None:
    key: tuple = ()
    for _ in range(3000):
        key = (key,)
    assert _message(workflow({"id": "a", "type": "echo", "params": {key: 1}})).endswith("nested deeper than 100 levels")


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            {"nodes": [{"id": "a", "type": "echo"}], "outputs": {"o": {"source": "${a[" + "9" * 5000 + "]}"}}},
            "outputs.o.source: ${a[99999999999999999999999999...}: list index with 5000 digits is too large",
        ),
        (
            {"nodes": [{"id": "a", "type": "echo", "batch": {"items": "${a[" + "9" * 5000 + "]}"}}]},
            "nodes[0] (id 'a').batch.items: ${a[99999999999999999999999999...}: "
            "list index with 5000 digits is too large",
        ),
        (
            {"ir_version": 7 * 10**4999, "nodes": [{"id": "a", "type": "echo"}]},
            "ir_version: must be a version string like '0.1.0', got int",
        ),
        (
            {"nodes": [{"id": "a", "type": "echo", "batch": {"items": 7 * 10**4999}}]},
            "nodes[0] (id 'a').batch.items: batch.items must be a template reference, like '${node.key}', "
            "got an integer of about 5000 digits",
        ),
    ],
)
def test_thousands_of_digits_anywhere(doc: dict, expected: str) -> None:
    assert _message(doc) == expected


def test_bytes_are_the_document_never_a_path(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow({"id": "a", "type": "echo"})))
    assert _message(str(path).encode()) == "workflow JSON: invalid JSON at line 1, column 1: Expecting value"
    assert ir.load(bytearray(path.read_bytes())).nodes[0].id == "a"


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(workflow({"id": "a", "type": "echo"})).encode())
    assert ir.load(path).nodes[0].id == "a"
    path.write_bytes(b'\xef\xbb\xbf{"nodes": "\xff"}')
    assert _message(path) == f"{path}: not UTF-8 text (byte 14: invalid start byte)"


def test_an_empty_string_is_not_taken_for_the_current_directory() -> None:
    assert _message("") == "the workflow source is empty text; pass a dict, JSON text or a path"
    assert _message("  \n") == "the workflow source is empty text; pass a dict, JSON text or a path"


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"a\nb": "${zz}"}, "nodes[0] (id 'a').params.a\\nb: ${zz} refers to unknown node or input 'zz'"),
        ({"p": "${\n zz}"}, "nodes[0] (id 'a').params.p: ${\\n zz} refers to unknown node or input 'zz'"),
        ({"p\u2028": "${zz}"}, "nodes[0] (id 'a').params.p\\u2028: ${zz} refers to unknown node or input 'zz'"),
        (
            {"p": "${" + "z" * 500 + "}"},
            "nodes[0] (id 'a').params.p: ${zzzzzzzzzzzzzzzzzzzzzzzzzzzz...} refers to "
            "unknown node or input 'zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...'",
        ),
    ],
)
def test_every_problem_is_one_short_line_whatever_it_quotes(params: dict, expected: str) -> None:
    message = _message(workflow({"id": "a", "type": "echo", "params": params}, inputs={}))
    assert message == expected and message.splitlines() == [message]


# -- the limit is the same at validation and at run time ------------------------------------------------------------


def _at_depth(doc_depth: int) -> dict:
    """A workflow whose deepest value sits `doc_depth` levels from the document's root."""
    # workflow {} > nodes [] > node {} > params {} > the value: four levels above the value's own
    return workflow(
        {"id": "a", "type": "echo", "params": {"p": _nested(doc_depth - 4), "x": "${x}"}},
        {"id": "b", "type": "echo", "params": {"copy": "${a.p}", "text": "p is ${a.p}"}},
        {"id": "c", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${x}"}},
    )


def test_a_workflow_nested_exactly_at_the_limit_validates_and_runs() -> None:
    wf = _at_depth(MAX_DEPTH)
    assert problem_in(wf) is None and problem_in({"one more": wf}) is not None  # exactly at the limit
    assert ir.load(json.dumps(wf)).nodes[0].params["p"] == _nested(MAX_DEPTH - 4)
    inputs = {"x": _deep_list(MAX_DEPTH)}  # an input may be as deep as the limit itself
    result = scheduler.run(wf, inputs)
    assert result.status == "success"
    assert result.shared["b"]["copy"] == _nested(MAX_DEPTH - 4)
    assert result.shared["c"]["results"] == [{"v": _deep_list(MAX_DEPTH - 1)}]


def test_one_level_more_is_a_validation_error_naming_where() -> None:
    wf = _at_depth(MAX_DEPTH + 1)
    assert _message(wf) == "nodes[0] (id 'a').params.p: nested deeper than 100 levels"
    text = json.dumps(wf)
    column = text.index("{", text.index('"p"')) + len('{"x": ') * 96 + 1  # the 97th bracket of the value
    assert _message(text) == f"workflow JSON: nested deeper than 100 levels at line 1, column {column}"
    with pytest.raises(ir.ValidationError, match=r"^inputs\.x: nested deeper than 100 levels$"):
        scheduler.run(_at_depth(MAX_DEPTH), {"x": _deep_list(MAX_DEPTH + 1)})
