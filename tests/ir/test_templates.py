"""Templates (ir/templates.py): type-preserving single templates, paths, interpolation, errors."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ir
import scheduler
from ir.templates import CompiledParams, references, resolve_template
from tests.support import workflow

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _echo_run(params: dict, shared: dict | None = None, inputs: dict | None = None) -> dict:
    result = scheduler.run(workflow({"id": "n", "type": "echo", "params": params}), inputs, shared=shared)
    assert result.status == "success"
    return result.shared["n"]


@pytest.mark.parametrize("value", [42, 3.5, True, None, [1, "a", {"k": 2}], {"k": [1, 2]}, "text"])
def test_single_template_preserves_type(value):
    out = _echo_run({"v": "${a}"}, shared={"a": value})
    assert out["v"] == value
    assert type(out["v"]) is type(value)


def test_single_template_returns_same_object():
    obj = {"deep": [1, 2]}
    out = _echo_run({"v": "${a}"}, shared={"a": obj})
    assert out["v"] is obj


def test_nested_path():
    shared = {"a": {"b": [{"c": 5}, {"c": 6}]}}
    out = _echo_run({"first": "${a.b[0].c}", "second": "${a.b[1].c}", "list": "${a.b}"}, shared=shared)
    assert out == {"first": 5, "second": 6, "list": [{"c": 5}, {"c": 6}]}


def test_node_output_path_across_nodes():
    wf = workflow(
        {"id": "src", "type": "echo", "params": {"rows": [{"name": "ada"}, {"name": "alan"}]}},
        {"id": "dst", "type": "echo", "params": {"second": "${src.rows[1].name}", "n": "${src.rows}"}},
    )
    shared = scheduler.run(wf).shared
    assert shared["dst"] == {"second": "alan", "n": [{"name": "ada"}, {"name": "alan"}]}


def test_string_interpolation_renders_json_for_containers():
    shared = {"d": {"k": 1}, "l": [1, "x"], "i": 3, "s": "str", "f": 1.5, "b": False}
    out = _echo_run({"v": "d=${d} l=${l} i=${i} s=${s} f=${f} b=${b}"}, shared=shared)
    assert out["v"] == 'd={"k": 1} l=[1, "x"] i=3 s=str f=1.5 b=False'
    assert json.loads(out["v"][2:10]) == {"k": 1}


def test_interpolation_with_none_is_empty():
    assert _echo_run({"v": "[${a}]"}, shared={"a": None})["v"] == "[]"


def test_templates_inside_nested_params():
    out = _echo_run({"cfg": {"name": "${who}", "tags": ["${who}", "x-${who}"], "n": 1}}, shared={"who": "ada"})
    assert out["cfg"] == {"name": "ada", "tags": ["ada", "x-ada"], "n": 1}


def test_inputs_resolve_at_root():
    assert _echo_run({"v": "${name}"}, inputs={"name": "ada"}) == {"v": "ada"}


def test_params_without_templates_untouched():
    params = {"v": "plain $ {not} {x}", "n": [1, {"a": None}]}
    assert _echo_run(params) == params


def test_reads_namespace_before_root():
    """A node's reads look in its own namespace first (from a previous run of the same node), then the root."""
    wf = workflow(
        {"id": "n", "type": "echo", "params": {"value": "${value}"}},
    )
    result = scheduler.run(wf, shared={"value": "root", "n": {"value": "namespaced"}})
    assert result.shared["n"]["value"] == "namespaced"


def test_unresolved_template_error_names_everything():
    with pytest.raises(ir.TemplateError) as info:
        _echo_run({"text": "hi ${missing_thing.x}"}, shared={"alpha": 1, "beta": {"k": 2}, "__hidden__": []})
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "node 'n'" in message
    assert "param 'text'" in message
    assert "${missing_thing.x}" in message
    assert "available keys: alpha, beta" in message
    assert "__hidden__" not in message


def test_unresolved_nested_path_error():
    with pytest.raises(ir.TemplateError, match=r"cannot resolve \$\{a\.b\[3\]\.c\}"):
        _echo_run({"v": "${a.b[3].c}"}, shared={"a": {"b": [1]}})


def test_unresolved_in_batch_item_names_node_and_param(backend):
    wf = workflow(
        {
            "id": "b",
            "type": "echo",
            "params": {"v": "${item.nope}"},
            "batch": {"items": "${x}", "error_handling": "continue"},
        }
    )
    agg = scheduler.run(wf, shared={"x": [{"k": 1}]}, backend=backend).shared["b"]
    assert agg["error_count"] == 1
    (error,) = agg["errors"]
    assert error["exception_type"] == "TemplateError"
    assert "node 'b' param 'v'" in error["error"]
    assert "${item.nope}" in error["error"]


def test_unresolved_batch_items_error(backend):
    wf = workflow({"id": "b", "type": "echo", "params": {}, "batch": {"items": "${nothing_here}"}})
    with pytest.raises(ir.TemplateError, match=r"node 'b' batch\.items.*\$\{nothing_here\}"):
        scheduler.run(wf, shared={"x": 1}, backend=backend)


def test_references_found_everywhere():
    refs = references({"a": "${x.y} and ${z[0]}", "b": ["${w}"], "c": 5})
    assert [(r.text, r.path) for r in refs] == [("${x.y}", ("x", "y")), ("${z[0]}", ("z", 0)), ("${w}", ("w",))]


@given(JSON_VALUES)
def test_property_single_template_roundtrip(value):
    params = CompiledParams({"p": "${v}", "q": "const"}, "n")
    resolved = params.resolve({"v": value})
    assert resolved == {"p": value, "q": "const"}
    assert resolved["p"] is value


@given(JSON_VALUES, st.text(alphabet=st.characters(blacklist_characters="$"), min_size=1, max_size=10))
def test_property_interpolation_renders(value, prefix):
    """Text around a template makes a string: containers as JSON, None as empty, scalars via str()."""
    out = resolve_template(f"{prefix}${{v}}", {"v": value}, "here")
    if isinstance(value, dict | list):
        assert json.loads(out[len(prefix) :]) == value
    elif value is None:
        assert out == prefix
    else:
        assert out == prefix + str(value)
