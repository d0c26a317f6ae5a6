"""Node types that the plan compiler (scheduler/plans.py) puts between a plan's tool calls.

A plan's states live in the store under `__states__` (`{_uid: state}`, a root key). Around each batch of
tool calls, `plan-gather` builds the batch items (each call's varying params, `†state.x` references read
from its `_uid`'s state) and `plan-scatter` writes each item's output at the call's `_outputPath`.
The path helpers here are the one reading of plan paths, for the compiler's static checks and for runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from pocketflow import Node

from ir.errors import TemplateError, shown
from worker.nodes.params import Param
from worker.nodes.registry import register

#: The store key holding the plan's states by `_uid` (a root dunder key: nodes write it at the root).
STATES_KEY = "__states__"
#: What starts a reference to the call's own state in a plan's param value: `†state.a.b`.
REF_PREFIX = "†state"

#: A path in a state: keys, and list indexes written `[n]` (a key of digits also indexes a list).
Path = tuple[str | int, ...]
_INDEX_RE = re.compile(r"\[([0-9]+)\]")
_MISSING = object()


def parse_path(text: str) -> Path:
    """`a.b[0].c` -> ('a', 'b', 0, 'c'); ValueError for an empty or malformed part."""
    parts: list[str | int] = []
    for part in text.split("."):
        name, bracket, indexes = part.partition("[")
        indexes = bracket + indexes
        if not name or _INDEX_RE.sub("", indexes):
            raise ValueError(f"invalid path {shown(text)} (write 'a.b' or 'a.b[0]')")
        parts.append(name)
        parts.extend(int(i) for i in _INDEX_RE.findall(indexes))
    return tuple(parts)


def path_text(path: Path) -> str:
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in path).removeprefix(".")


def shown_path(path: Path) -> str:
    return f"'{path_text(path)}'" if path else "the whole state"


def reference(value: Any) -> Path | None:
    """The state path a param value reads (`†state.a.b` -> ('a', 'b'); `†state` -> ()), or None for a
    literal. A string starting with `†` that is not a state reference is a ValueError."""
    if not isinstance(value, str) or not value.startswith("†"):
        return None
    if value == REF_PREFIX:
        return ()
    if not value.startswith(REF_PREFIX + "."):
        raise ValueError(f"{shown(value)} is not a state reference (write '†state.a.b')")
    return parse_path(value[len(REF_PREFIX) + 1 :])


def references(value: Any, where: str) -> Iterator[tuple[str, Path]]:
    """(where, path) of every state reference inside a param value (dicts and lists are walked)."""
    path = reference(value)
    if path is not None:
        yield where, path
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            yield from references(inner, f"{where}.{key}")
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from references(inner, f"{where}[{i}]")


def _index(part: str | int) -> int | None:
    """The list index a path part means: `[n]`, or a key of ASCII digits."""
    if isinstance(part, int):
        return part
    return int(part) if part.isascii() and part.isdigit() else None


def lookup(state: Any, path: Path) -> Any:
    """The value at `path`, or the private _MISSING sentinel."""
    value = state
    for part in path:
        index = _index(part)
        if isinstance(value, Mapping) and isinstance(part, str):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and index is not None and index < len(value):
            value = value[index]
        else:
            return _MISSING
    return value


def has(state: Any, path: Path) -> bool:
    return lookup(state, path) is not _MISSING


def resolve(value: Any, state: Any, where: str) -> Any:
    """`value` with every state reference replaced by what it points at in `state` (values are shared,
    not copied: items are encoded for their trip, and the scatter node never writes in place)."""
    path = reference(value)
    if path is not None:
        found = lookup(state, path)
        if found is _MISSING:
            raise TemplateError(f"{where}: cannot resolve {value}: {shown_path(path)} is not in the state")
        return found
    if isinstance(value, Mapping):
        return {key: resolve(inner, state, f"{where}.{key}") for key, inner in value.items()}
    if isinstance(value, list):
        return [resolve(inner, state, f"{where}[{i}]") for i, inner in enumerate(value)]
    return value


def assign(state: Any, path: Path, value: Any, where: str) -> Any:
    """A copy of `state` with `value` at `path`: only the containers along the path are copied, so the
    previous states (and the workflow's input default) are never changed. Missing objects are created;
    lists are not (an index writes into a list that is there)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(state, Mapping) and isinstance(head, str):
        child = state.get(head)
        copied = dict(state)
        copied[head] = assign({} if child is None and rest and isinstance(rest[0], str) else child, rest, value, where)
        return copied
    index = _index(head)
    if isinstance(state, list) and index is not None and index < len(state):
        copied_list = list(state)
        copied_list[index] = assign(state[index], rest, value, where)
        return copied_list
    part = f"[{head}]" if isinstance(head, int) else shown(head)
    if state is None:
        kind = "nothing (only objects are created)"
    else:
        kind = "a list too short" if isinstance(state, list) else f"a {type(state).__name__}"
    raise ValueError(f"{where}: cannot write {part} into {kind}")


def output_of(namespace: Any) -> Any:
    """What a call writes at its `_outputPath`: its tool's namespace, or the single value when it wrote one key."""
    if isinstance(namespace, Mapping) and len(namespace) == 1:
        return next(iter(namespace.values()))
    return namespace


def call_label(index: int, uid: str) -> str:
    return f"calls[{index}] (_uid {shown(uid)})"


def _calls(params: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(label, uid, call) for each `[call index, _uid]` pair of param `calls`, the call taken from param `plan`."""
    calls = params["plan"]["calls"]
    for index, uid in params["calls"]:
        yield call_label(index, uid), uid, calls[index]


#: The params both plan nodes read the plan and its states from.
_PLAN_PARAMS = {
    "plan": Param("the plan ({'calls': [...]}, usually '${plan}')", required=True),
    "states": Param("the states by _uid (usually '${__states__}')", required=True),
}


class _PlanCallsNode(Node):
    """A node over some calls of a plan: everything it works on is in its params."""

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)


@register("plan-gather")
class GatherNode(_PlanCallsNode):
    """Builds the items of one batch of plan calls: each call's varying params, `†state` references resolved."""

    PARAMS = {
        **_PLAN_PARAMS,
        "calls": Param("[call index, _uid] pairs, one per item, in item order", required=True),
        "keys": Param("{param name: item key} of the params that vary between the calls"),
    }

    def exec(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        states, keys = params["states"], params.get("keys") or {}
        items = []
        for where, uid, call in _calls(params):
            state = states[uid]
            items.append({key: resolve(call[name], state, f"{where} param '{name}'") for name, key in keys.items()})
        return items

    def post(self, shared: Any, prep_res: Any, exec_res: list[dict[str, Any]]) -> str:
        shared["items"] = exec_res
        return "default"


@register("plan-scatter")
class ScatterNode(_PlanCallsNode):
    """Writes each plan call's output (its tool's namespace, or the single value of a one-key namespace)
    at its `_outputPath` in its `_uid`'s state: a new `__states__`, the old one left as it was."""

    PARAMS = {
        **_PLAN_PARAMS,
        "calls": Param("[call index, _uid] pairs, in the order of `results`", required=True),
        "results": Param("the batch node's results (one namespace per call)", required=True),
    }

    def exec(self, params: dict[str, Any]) -> dict[str, Any]:
        states = dict(params["states"])
        results = params["results"]
        if len(results) != len(params["calls"]):
            raise ValueError(f"plan-scatter: {len(results)} results for {len(params['calls'])} calls")
        for (label, uid, call), namespace in zip(_calls(params), results, strict=True):
            where = f"{label} _outputPath {shown(call['_outputPath'])}"
            states[uid] = assign(states[uid], parse_path(call["_outputPath"]), output_of(namespace), where)
        return states

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        shared[STATES_KEY] = exec_res
        return "default"
