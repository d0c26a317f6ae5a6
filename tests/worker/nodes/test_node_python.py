"""The `python` node: 'module:function' resolution, keyword arguments, errors and retries."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import scheduler
from worker.nodes.python_call import PythonNode
from worker.store import NamespacedStore

FUNCS = "tests.support.pyfuncs"


def run_python(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    node = PythonNode()
    node.params = params
    store: dict[str, Any] = {}
    return node._run(store), store


def test_calls_the_function_with_the_other_params_as_kwargs() -> None:
    action, out = run_python({"function": f"{FUNCS}:add", "a": 2, "b": 3})
    assert action == "default"
    assert out == {"result": 5}


def test_every_param_but_function_is_passed() -> None:
    _, out = run_python({"function": f"{FUNCS}:describe", "x": [1, 2], "y": {"k": None}})
    assert out["result"] == {"x": [1, 2], "y": {"k": None}}


def test_dotted_attribute_after_the_colon() -> None:
    _, out = run_python({"function": f"{FUNCS}:Greeter.greet", "name": "ada"})
    assert out["result"] == "hello ada!"


def test_result_goes_to_the_node_namespace() -> None:
    root: dict[str, Any] = {}
    node = PythonNode()
    node.params = {"function": f"{FUNCS}:add", "a": 1, "b": 1}
    node._run(NamespacedStore(root, "calc"))
    assert root == {"calc": {"result": 2}}


@pytest.mark.parametrize(
    ("function", "message"),
    [
        (None, "python: param 'function' is required"),
        ("tests.support.pyfuncs.add", "must be 'module:function'"),
        (":add", "must be 'module:function'"),
        (f"{FUNCS}:", "must be 'module:function'"),
        (7, "must be 'module:function'"),
        ("no_such_module_xyz:run", "cannot import module 'no_such_module_xyz'"),
        (f"{FUNCS}:nope", "has no function 'nope'"),
        (f"{FUNCS}:Greeter.nope", "has no function 'Greeter.nope'"),
        (f"{FUNCS}:NOT_CALLABLE", "is not callable"),
    ],
)
def test_bad_function_reference_raises_value_error(function: Any, message: str) -> None:
    params = {} if function is None else {"function": function}
    with pytest.raises(ValueError, match=message) as info:
        run_python(params)
    assert str(info.value).startswith("python:")


def test_exceptions_from_the_function_propagate() -> None:
    with pytest.raises(ZeroDivisionError):
        run_python({"function": f"{FUNCS}:divide", "a": 1, "b": 0})


def test_wrong_kwargs_raise_type_error() -> None:
    with pytest.raises(TypeError):
        run_python({"function": f"{FUNCS}:add", "a": 1, "c": 2})


def test_end_to_end_templated_kwargs_keep_their_type() -> None:
    workflow = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"x": 4}},
            {"id": "calc", "type": "python", "params": {"function": f"{FUNCS}:add", "a": "${src.x}", "b": 10}},
            {"id": "greet", "type": "python", "params": {"function": f"{FUNCS}:Greeter.greet", "name": "${who}"}},
        ]
    }
    result = scheduler.run(workflow, {"who": "bob"})
    assert result.status == "success"
    assert result.shared["calc"] == {"result": 14}
    assert result.shared["greet"] == {"result": "hello bob!"}


def test_end_to_end_node_retries_apply_to_the_call() -> None:
    token = uuid.uuid4().hex
    node = {"id": "f", "type": "python", "max_retries": 3, "params": {"function": f"{FUNCS}:flaky"}}
    node["params"].update(token=token, failures=2)
    result = scheduler.run({"nodes": [node]})
    assert result.shared["f"] == {"result": 3}


def test_end_to_end_exhausted_retries_raise_the_original_error() -> None:
    token = uuid.uuid4().hex
    node = {"id": "f", "type": "python", "max_retries": 2, "params": {"function": f"{FUNCS}:flaky"}}
    node["params"].update(token=token, failures=5)
    with pytest.raises(RuntimeError, match="attempt 2 fails"):
        scheduler.run({"nodes": [node]})
