"""`python`: call an importable Python function with the node's other params as keyword arguments.

The function is resolved in prep (a bad reference is a configuration error, not worth a retry) and
called in exec (so the node's retries apply to what it raises). Its return value is `result`; on the
celery backend it must be msgpack/JSON-serializable like everything else in the store.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pocketflow import Node

from worker.nodes.params import param
from worker.nodes.registry import register


def _is_reference(reference: str) -> bool:
    return reference.count(":") == 1 and all(reference.split(":"))


def resolve_function(reference: Any) -> Callable[..., Any]:
    """'package.module:function' (or 'module:Class.method') -> the callable, or ValueError naming it."""
    reference = param(
        "python", {"function": reference}, "function", str, required=True, what="'module:function'", check=_is_reference
    )
    module_name, attr_path = reference.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"python: cannot import module '{module_name}' (function {reference!r}): {exc}") from exc
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except AttributeError:
            raise ValueError(f"python: module '{module_name}' has no function '{attr_path}'") from None
    if not callable(target):
        raise ValueError(f"python: {reference!r} is not callable ({type(target).__name__})")
    return target


@register("python")
class PythonNode(Node):
    """Calls `function(**other_params)` and writes its return value as `result`."""

    PARAMS = {
        "function": "(required) 'module:function' to call; the module must be importable on every worker",
        "*": "every other param is passed to the function as a keyword argument",
    }

    def prep(self, shared: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
        kwargs = {k: v for k, v in self.params.items() if k != "function"}
        return resolve_function(self.params.get("function")), kwargs

    def exec(self, prep_res: tuple[Callable[..., Any], dict[str, Any]]) -> Any:
        function, kwargs = prep_res
        return function(**kwargs)

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["result"] = exec_res
        return "default"
