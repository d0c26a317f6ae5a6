"""Static checks (ir/checks.py, ir/loader.py): every problem named, located, and reported together."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import ir
import scheduler
from tests.support import batch_node, workflow
from worker.engine.loader import load as compiler_load


def _problems(source, *, via=scheduler.compile) -> ir.ValidationError:
    with pytest.raises(ir.ValidationError) as info:
        via(source)
    assert isinstance(info.value, ValueError)
    return info.value


def _echo(node_id: str, **params) -> dict:
    return {"id": node_id, "type": "echo", "params": params}


# --- node types -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("via", [scheduler.compile, compiler_load])
def test_unknown_node_type_did_you_mean(via):
    err = _problems(workflow({"id": "a", "type": "ecoh"}), via=via)
    assert err.problems == ["nodes[0] (id 'a').type: unknown node type 'ecoh' (did you mean 'echo'?)"]


def test_unknown_node_type_without_close_match():
    err = _problems(workflow({"id": "a", "type": "zzzzzzzz"}))
    assert "unknown node type 'zzzzzzzz'" in str(err)
    assert "did you mean" not in str(err)


def test_plugin_node_types_are_known():
    wf = scheduler.compile(workflow({"id": "a", "type": "test-upper", "params": {"text": "x"}}))
    assert wf.start_node is not None


def test_ir_load_alone_does_not_know_node_types():
    """`ir` knows no node types: the registry check happens in scheduler.compile / worker.engine.loader.load."""
    wf = ir.load(workflow({"id": "a", "type": "ecoh"}))
    assert wf.nodes[0].type == "ecoh"
    err = _problems(workflow({"id": "a", "type": "ecoh"}), via=lambda s: ir.load(s, node_types=["echo"]))
    assert "did you mean 'echo'?" in str(err)


# --- graph ----------------------------------------------------------------------------------------------


def test_edges_to_unknown_nodes():
    wf = workflow(_echo("a"), _echo("b"), edges=[{"from": "a", "to": "bb"}, {"from": "zz", "to": "b"}])
    err = _problems(wf)
    assert err.problems == [
        "edges[0].to: unknown node 'bb' (did you mean 'b'?)",
        "edges[1].from: unknown node 'zz'",
    ]


def test_unknown_start_node():
    err = _problems(workflow(_echo("a"), start_node="aa"))
    assert err.problems == ["start_node: unknown node 'aa' (did you mean 'a'?)"]


def test_two_default_edges_from_one_node_name_the_node_the_action_and_both_targets():
    wf = workflow(_echo("a"), _echo("b"), _echo("c"), edges=[{"from": "a", "to": "b"}, {"from": "a", "to": "c"}])
    err = _problems(wf, via=ir.load)
    assert err.problems == [
        "edges[1]: node 'a' already has an edge for action 'default' (edges[0] to 'b'); this one goes to 'c': "
        "an action leads to one node"
    ]


def test_two_edges_for_the_same_named_action_are_reported_with_the_other_problems():
    edges = [
        {"from": "a", "to": "b", "action": "retry"},
        {"from": "a", "to": "c"},
        {"from": "a", "to": "a", "action": "retry"},
        {"from": "a", "to": "b", "action": "retry"},
        {"from": "b", "to": "zz"},
    ]
    err = _problems(workflow(_echo("a"), _echo("b"), _echo("c"), edges=edges))
    assert err.problems == [
        "edges[4].to: unknown node 'zz'",
        "edges[2]: node 'a' already has an edge for action 'retry' (edges[0] to 'b'); this one goes to 'a': "
        "an action leads to one node",
        "edges[3]: node 'a' already has an edge for action 'retry' (edges[0] to 'b'); this one goes to 'b': "
        "an action leads to one node",
    ]


def test_one_edge_per_action_is_fine():
    edges = [{"from": "a", "to": "b"}, {"from": "a", "to": "c", "action": "retry"}, {"from": "b", "to": "c"}]
    assert ir.load(workflow(_echo("a"), _echo("b"), _echo("c"), edges=edges)).warnings == []


def test_no_example_relies_on_two_edges_for_one_action():
    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.json"))
    assert examples
    for path in examples:
        assert isinstance(ir.load(path), ir.Workflow), path


def test_duplicate_ids():
    err = _problems(workflow(_echo("a"), _echo("b"), _echo("a")))
    assert err.problems == ["nodes[2] (id 'a'): duplicate node id (first used by nodes[0])"]


def test_invalid_node_id():
    err = _problems(workflow(_echo("1a")))
    assert err.problems == [
        "nodes[0].id: node id '1a' may contain only letters, digits, '_' and '-', "
        "and must not start with a digit or '-'"
    ]


# --- templates ------------------------------------------------------------------------------------------


def test_template_to_unknown_node_did_you_mean():
    err = _problems(workflow(_echo("list", files=["f"]), _echo("b", v="${lsit.files}")))
    assert err.problems == [
        "nodes[1] (id 'b').params.v: ${lsit.files} refers to unknown node or input 'lsit' (did you mean 'list'?)"
    ]


def test_template_to_undeclared_input_when_inputs_declared():
    err = _problems(workflow(_echo("a", v="${nme}"), inputs={"name": {"type": "string"}}))
    assert "${nme} refers to unknown node or input 'nme' (did you mean 'name'?)" in str(err)


def test_template_to_declared_input_ok():
    wf = ir.load(workflow(_echo("a", v="${name}"), inputs={"name": {"type": "string"}}))
    assert wf.nodes[0].params == {"v": "${name}"}


def test_template_to_node_that_runs_later():
    err = _problems(workflow(_echo("a", v="${b.x}"), _echo("b")))
    assert err.problems == ["nodes[0] (id 'a').params.v: ${b.x} refers to node 'b', which does not run before 'a'"]


def test_template_to_node_on_other_branch():
    wf = workflow(
        _echo("start"),
        _echo("left"),
        _echo("right", v="${left.x}"),
        edges=[{"from": "start", "to": "left", "action": "l"}, {"from": "start", "to": "right", "action": "r"}],
    )
    err = _problems(wf)
    assert "refers to node 'left', which does not run before 'right'" in str(err)


def test_template_nested_in_params_checked():
    err = _problems(workflow(_echo("a", cfg={"list": ["${b.x}"]}), _echo("b")))
    assert "nodes[0] (id 'a').params.cfg: ${b.x} refers to node 'b'" in str(err)


def test_batch_items_to_node_that_runs_later():
    err = _problems(workflow(batch_node("a", items="${b.files}"), _echo("b", files=[])))
    assert "nodes[0] (id 'a').batch.items: ${b.files} refers to node 'b', which does not run before 'a'" in str(err)


def test_template_to_earlier_node_alias_and_dunder_ok():
    wf = workflow(
        _echo("prev", files=["a"]),
        batch_node(
            "b", node_type="echo", items="${prev.files}", params={"f": "${file}", "i": "${__index__}"}, **{"as": "file"}
        ),
        _echo("after", r="${b.results}", e="${_error.message}"),
    )
    assert [n.id for n in compiler_load(wf).nodes] == ["prev", "b", "after"]


def test_alias_shadowing_node_id():
    err = _problems(workflow(_echo("a"), batch_node("b", items="${a.x}", **{"as": "a"})))
    assert err.problems == ["nodes[1] (id 'b').batch.as: alias 'a' shadows the node id 'a'"]


# --- several problems at once ---------------------------------------------------------------------------


def test_several_problems_reported_together():
    wf = workflow(
        _echo("a", v="${c.x}"),
        _echo("a"),
        {"id": "c", "type": "ecoh"},
        edges=[{"from": "a", "to": "nowhere"}],
    )
    err = _problems(wf)
    text = str(err)
    assert len(err.problems) == 4
    assert text.startswith("4 problems:\n")
    for fragment in (
        "duplicate node id",
        "edges[0].to: unknown node 'nowhere'",
        "${c.x} refers to node 'c', which does not run before 'a'",
        "unknown node type 'ecoh'",
    ):
        assert fragment in text
    assert all(f"  - {p}" in text for p in err.problems)


def test_several_schema_problems_reported_together():
    wf = workflow(
        {"id": "a", "type": "echo", "bogus": 1, "batch": {"items": "nope", "as": "1x", "error_handling": "x"}},
        {"id": "b"},
    )
    err = _problems(wf, via=ir.load)
    text = str(err)
    assert "nodes[0] (id 'a').bogus: unknown field" in text
    assert "batch.items must be a template reference" in text
    assert "batch.as must be a valid identifier" in text
    assert "batch.error_handling must be 'fail_fast' or 'continue'" in text
    assert "nodes[1] (id 'b').type: is required" in text
    assert len(err.problems) == 5


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_retries", 0), ("retry_wait", -1), ("max_concurrent", 0), ("chunk_size", 0)],
)
def test_batch_numeric_bounds(field, value):
    err = _problems(workflow(batch_node(**{field: value})), via=ir.load)
    assert f"batch.{field}" in str(err)


def test_empty_nodes_rejected():
    err = _problems({"nodes": []}, via=ir.load)
    assert "nodes" in str(err)


# --- sources --------------------------------------------------------------------------------------------


def test_malformed_json_string_line_and_column():
    text = '{"nodes": [\n  {"id": "a",, "type": "echo"}]}'
    err = _problems(text, via=ir.load)
    assert re.search(r"invalid JSON at line 2, column 14\b", str(err)), str(err)


def test_malformed_json_file_names_path_line_and_column(tmp_path: Path):
    path = tmp_path / "wf.json"
    path.write_text('{\n  "nodes": [\n    {"id": "a" "type": "echo"}\n  ]\n}\n')
    err = _problems(path, via=ir.load)
    assert str(err).startswith(f"{path}: ")
    assert "invalid JSON at line 3, column 16" in str(err)


def test_missing_file(tmp_path: Path):
    path = tmp_path / "missing.json"
    err = _problems(str(path), via=ir.load)
    assert str(err) == f"{path}: file not found"


def test_directory_is_not_a_workflow(tmp_path: Path):
    err = _problems(tmp_path, via=ir.load)
    assert "is a directory" in str(err)


def test_not_an_object_and_unsupported_source():
    assert "must be a JSON object, got list" in str(_problems("[1, 2]", via=ir.load))
    assert "cannot load a workflow from int" in str(_problems(5, via=ir.load))


def test_problems_in_file_are_prefixed_with_path(tmp_path: Path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(workflow(_echo("a"), _echo("a"))))
    err = _problems(path, via=ir.load)
    assert str(err) == f"{path}: nodes[1] (id 'a'): duplicate node id (first used by nodes[0])"
    assert err.source == str(path)


def test_load_from_dict_json_string_and_path(tmp_path: Path):
    data = workflow(
        _echo("a", v=1),
        batch_node("b", items="${a.list}", error_handling="continue", **{"as": "row"}),
        name="demo",
    )
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(data))
    loaded = [
        ir.load(data),
        ir.load(json.dumps(data)),
        ir.load(path),
        ir.load(str(path)),
        ir.load(json.dumps(data).encode()),
    ]
    for wf in loaded:
        assert isinstance(wf, ir.Workflow)
        assert wf.name == "demo"
        assert [n.id for n in wf.nodes] == ["a", "b"]
        assert wf.nodes[1].batch.alias == "row"
        assert wf.nodes[1].batch.error_handling == "continue"
    assert all(wf.wire() == loaded[0].wire() for wf in loaded)
    assert ir.load(loaded[0]).wire() == loaded[0].wire()


def test_load_does_not_mutate_dict_source():
    data = workflow(batch_node())
    snapshot = json.dumps(data, sort_keys=True)
    ir.load(data)
    assert json.dumps(data, sort_keys=True) == snapshot


def test_scheduler_run_validates_before_running():
    shared = {"x": ["a"]}
    with pytest.raises(ir.ValidationError, match="unknown node type 'ecoh'"):
        scheduler.run(workflow({"id": "a", "type": "ecoh"}), shared=shared)
    assert shared == {"x": ["a"]}


def test_batch_defaults():
    batch = ir.load(workflow(batch_node())).nodes[0].batch
    assert (batch.alias, batch.error_handling, batch.parallel, batch.max_retries, batch.retry_wait) == (
        "item",
        "fail_fast",
        False,
        1,
        0,
    )
    assert batch.max_concurrent is None
    assert batch.chunk_size is None


@pytest.mark.parametrize("items", ["${1abc}", "${a} and more", "${a.b"])
def test_batch_items_must_be_exactly_one_valid_template(items: str) -> None:
    with pytest.raises(ir.ValidationError, match=r"batch\.items must be a template reference"):
        ir.load({"nodes": [{"id": "a", "type": "echo", "batch": {"items": items}}]})


def test_outputs_must_reference_existing_nodes_or_inputs() -> None:
    with pytest.raises(ir.ValidationError) as caught:
        ir.load(
            {
                "nodes": [{"id": "count", "type": "echo"}],
                "inputs": {"folder": {}},
                "outputs": {"total": {"source": "${cuont.total}"}, "plain": {"source": "no template"}},
            }
        )
    message = str(caught.value)
    assert (
        "outputs.total.source: ${cuont.total} refers to unknown node or input 'cuont' (did you mean 'count'?)"
        in message
    )
    assert "outputs.plain.source: must be a template" in message


# --- python functions and ir_version --------------------------------------------------------------------


def _python(node_id: str, function) -> dict:
    return {"id": node_id, "type": "python", "params": {"function": function}}


def test_python_function_that_does_not_resolve_is_a_validation_error(tmp_path: Path, monkeypatch):
    import worker.nodes.python_call  # noqa: F401  (registers the `python` node type)

    (tmp_path / "explodes_on_import.py").write_text("raise RuntimeError('no config')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = workflow(
        _echo("a"),
        _python("p", "nosuch_module_q:f"),
        _python("q", "tests.support.pyfuncs:nope"),
        _python("r", "explodes_on_import:f"),
        _python("s", "tests.support.pyfuncs:NOT_CALLABLE"),
        _python("t", "no colon"),
        _python("u", "${a.function}"),
        _python("v", "tests.support.pyfuncs:Greeter.greet"),
    )
    assert _problems(wf).problems == [
        "nodes[1] (id 'p').params.function: cannot import module 'nosuch_module_q' (No module named 'nosuch_module_q')",
        "nodes[2] (id 'q').params.function: module 'tests.support.pyfuncs' has no attribute 'nope'",
        "nodes[3] (id 'r').params.function: cannot import module 'explodes_on_import' (RuntimeError: no config)",
        "nodes[4] (id 's').params.function: 'tests.support.pyfuncs:NOT_CALLABLE' is not callable (int)",
        "nodes[5] (id 't').params.function: must be 'module:function', got 'no colon'",
    ]


def test_unknown_ir_version_names_the_known_ones():
    err = _problems(workflow(_echo("a"), ir_version="9.9.9"), via=ir.load)
    assert err.problems == ["ir_version: unknown version '9.9.9' (this chordflow reads 0.1.0)"]


def test_missing_ir_version_means_the_current_one():
    wf = ir.load({"nodes": [_echo("a")]})
    assert wf.ir_version == "0.1.0"
    assert "omitted means 0.1.0" in ir.json_schema()["properties"]["ir_version"]["description"]


# --- params declared by each node type (worker/nodes/params.py) ----------------------------------------


@pytest.mark.parametrize(
    ("node_type", "params", "problem"),
    [
        ("http", {"ulr": "https://example.com"}, "params.ulr: unknown param (did you mean 'url'?)"),
        ("shell", {"comand": "ls"}, "params.comand: unknown param (did you mean 'command'?)"),
        ("read-file", {"pth": "/tmp/x"}, "params.pth: unknown param (did you mean 'path'?)"),
        ("llm", {"promt": "hi"}, "params.promt: unknown param (did you mean 'prompt'?)"),
        ("llm", {"model": "fake"}, "params.prompt: required (or `messages`)"),
        (
            "llm",
            {"prompt": "a", "messages": [{"role": "user", "content": "b"}], "model": "fake"},
            "params.messages: give `prompt` or `messages`, not both",
        ),
        (
            "llm",
            {"messages": [{"role": "user"}], "model": "fake"},
            "params.messages: must be a list of {role, content} objects with string values, got [{'role': 'user'}]",
        ),
        (
            "http",
            {"url": "ftp://example.com/x"},
            "params.url: must be an http:// or https:// URL, got 'ftp://example.com/x'",
        ),
        (
            "shell",
            {"command": "ls", "timeout": "soon"},
            "params.timeout: must be a positive number of seconds, got str",
        ),
        ("http", {"method": "GET"}, "params.url: is required"),
        ("write-file", {"path": "/tmp/x", "content": "", "append": "yes"}, "params.append: must be a boolean, got str"),
    ],
)
def test_node_params_are_checked_against_the_node_types_declarations(node_type, params, problem):
    err = _problems(workflow({"id": "a", "type": node_type, "params": params}))
    assert err.problems == [f"nodes[0] (id 'a').{problem}"]


def test_a_templated_param_value_is_checked_when_resolved_not_at_validation():
    wf = workflow(
        _echo("src", url="ftp://x", timeout="soon"),
        {"id": "a", "type": "http", "params": {"url": "${src.url}", "timeout": "${src.timeout}"}},
    )
    assert [node.id for node in compiler_load(wf).nodes] == ["src", "a"]
    with pytest.raises(ValueError, match=r"^http: param 'url' must be an http:// or https:// URL, got 'ftp://x'$"):
        scheduler.run(wf)


def test_node_types_taking_any_param_accept_any_name():
    wf = workflow(_echo("a", anything=1), {"id": "p", "type": "python", "params": {"function": "json:dumps", "obj": 1}})
    assert len(compiler_load(wf).nodes) == 2


def test_chordflow_nodes_shows_the_declarations_validation_checks():
    from worker.nodes import all_types

    shell = all_types()["shell"].PARAMS
    assert str(shell["command"]).startswith("(required)") and shell["command"].required
    assert shell["timeout"].problem("soon") == "must be a positive number of seconds, got str"


def test_every_problem_is_reported_in_the_first_pass_bad_batch_fields_included(tmp_path: Path):
    """Malformed batch fields no longer hide the checks after them: one pass names every problem."""
    wf = {
        "nodes": [
            {"id": "a", "type": "http", "params": {"ulr": "https://example.com"}},
            {"id": "b", "type": "echo", "batch": {"items": "${a.items}", "error_handling": "ignore", "max_retries": 0}},
            {"id": "b", "type": "ecko", "params": {"x": "${nope.x}"}},
        ],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "zz"}],
    }
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(wf))
    err = _problems(str(path))
    assert err.source == str(path)
    assert sorted(err.problems) == sorted(
        [
            "nodes[1] (id 'b').batch.error_handling: batch.error_handling must be 'fail_fast' or 'continue', "
            "got 'ignore'",
            "nodes[1] (id 'b').batch.max_retries: Input should be greater than or equal to 1",
            "nodes[2] (id 'b'): duplicate node id (first used by nodes[1])",
            "edges[1].to: unknown node 'zz'",
            "nodes[2] (id 'b').type: unknown node type 'ecko' (did you mean 'echo'?)",
            "nodes[0] (id 'a').params.ulr: unknown param (did you mean 'url'?)",
        ]
    )
