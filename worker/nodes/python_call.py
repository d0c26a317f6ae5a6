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

from ir.templates import references
from worker.nodes.params import ANY, Param
from worker.nodes.registry import register


def _is_reference(reference: str) -> bool:
    return reference.count(":") == 1 and all(reference.split(":"))


def resolve_function(reference: Any) -> Callable[..., Any]:
    """'package.module:function' (or 'module:Class.method') -> the callable, or ValueError naming it."""
    reference = PythonNode.PARAMS["function"].get("python", {"function": reference}, "function")
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


def check_function_param(raw_params: dict[str, Any]) -> dict[str, str] | None:
    """Static check of a literal `function`: the module imports and the function exists and is callable.

    Run by the loader (worker/engine/loader.py) on the unresolved params, so a typo fails at validation, not mid-run.
    Importing runs the module's top-level code, as the run would; whatever it raises becomes the message.
    A templated `function` is known only at run time and is not checked.
    """
    reference = raw_params.get("function") if isinstance(raw_params, dict) else None
    if reference is None:
        return {"function": "is required ('module:function')"}
    if isinstance(reference, str) and references(reference):
        return None
    if not isinstance(reference, str) or not _is_reference(reference):
        return {"function": _bad_form(reference)}
    module_name, attr_path = reference.split(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        return {"function": f"cannot import module '{module_name}' ({_one_line(exc)})"}
    except (Exception, SystemExit) as exc:  # the module's own code failed: name what it raised
        return {"function": f"cannot import module '{module_name}' ({type(exc).__name__}: {_one_line(exc)})"}
    for attr in attr_path.split("."):
        try:
            target = getattr(target, attr)
        except Exception:
            return {"function": f"module '{module_name}' has no attribute '{attr_path}'"}
    if not callable(target):
        return {"function": f"{reference!r} is not callable ({type(target).__name__})"}
    return None


def _bad_form(value: Any) -> str:
    got = repr(value[:80]) if isinstance(value, str) else type(value).__name__
    return f"must be 'module:function', got {got}"


def _one_line(exc: BaseException, limit: int = 200) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@register("python")
class PythonNode(Node):
    """Calls `function(**other_params)` and writes its return value as `result`."""

    PARAMS = {
        "function": Param(
            "(required) 'module:function' to call; the module must be importable on every worker",
            str, required=True, what="'module:function'", check=_is_reference,
        ),
        ANY: Param("every other param is passed to the function as a keyword argument"),
    }  # fmt: skip

    check_params = staticmethod(check_function_param)  # static validation hook (worker/engine/loader.py)

    def prep(self, shared: Any) -> tuple[Callable[..., Any], dict[str, Any]]:
        kwargs = {k: v for k, v in self.params.items() if k != "function"}
        return resolve_function(self.params.get("function")), kwargs

    def exec(self, prep_res: tuple[Callable[..., Any], dict[str, Any]]) -> Any:
        function, kwargs = prep_res
        return function(**kwargs)

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["result"] = exec_res
        return "default"
