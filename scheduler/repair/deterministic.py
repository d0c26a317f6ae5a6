"""The `deterministic` generator: repairs what needs no model, by closest match ("did you mean").

Each fix is one generator over the workflow (edited in place) yielding what it changed, like the static
checks of ir/checks.py; a new kind of fix is one more function in FIXES:

- template references to a misspelt key or node id (`${n2.lable}` -> `${n2.label}`), matched against the
  keys available where the run failed (those the error lists, the run's checkpointed store, one level
  down the path that did not resolve; a batch item's keys from the first item), node ids and inputs;
- misspelt node types, against the registered types;
- a param name misspelt against the params the node type declares (`PARAMS`);
- edge ends and `start_node` naming a misspelt node id.

A run that failed at a node is repaired at that node only; a workflow that never ran (it did not
validate) everywhere.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from ir.errors import TemplateError
from ir.subworkflows import SUB_PARAMS
from ir.templates import references
from scheduler.repair.failure import closest, undeclared_params
from scheduler.repair.generators import RepairRequest, register_generator
from worker.nodes import registry

_NOTHING = object()


@register_generator("deterministic")
class DeterministicGenerator:
    """Closest-match repairs of names; None when nothing in the workflow looks misspelt."""

    def generate(self, request: RepairRequest) -> dict[str, Any] | None:
        workflow = copy.deepcopy(request.workflow)
        fixed = [change for fix in FIXES for change in fix(workflow, request)]
        return workflow if fixed else None


def _suspects(workflow: dict[str, Any], request: RepairRequest) -> list[dict[str, Any]]:
    """The nodes to repair: the one the run failed at, or all of them (a workflow that never ran)."""
    nodes = [n for n in workflow.get("nodes", []) if isinstance(n, dict)]
    at = [n for n in nodes if n.get("id") == request.failure.node]
    return at if at and request.failure.run_id is not None else nodes


def node_types(workflow: dict[str, Any], request: RepairRequest) -> Iterator[str]:
    known = registry.names()
    for node in _suspects(workflow, request):
        if node.get("type") not in known and (close := closest(node.get("type"), known)):
            yield f"nodes '{node.get('id')}'.type: {node['type']} -> {close}"
            node["type"] = close


def param_names(workflow: dict[str, Any], request: RepairRequest) -> Iterator[str]:
    for node in _suspects(workflow, request):
        for wrong, right in undeclared_params(node).items():
            node["params"] = {right if name == wrong else name: value for name, value in node["params"].items()}
            yield f"node '{node.get('id')}' param {wrong} -> {right}"


def template_refs(workflow: dict[str, Any], request: RepairRequest) -> Iterator[str]:
    nodes = [n for n in workflow.get("nodes", []) if isinstance(n, dict)]
    store = request.store or {}
    roots = {n.get("id") for n in nodes} | set(workflow.get("inputs") or {}) | set(request.available_keys) | set(store)
    roots = {r for r in roots if isinstance(r, str) and "." not in r and not r.startswith("_")}
    for node in _suspects(workflow, request):
        batch = node.get("batch") if isinstance(node.get("batch"), dict) else None
        alias = batch.get("as", "item") if batch else None
        in_item = Paths(roots | {alias} if alias else roots, store, alias, _first_item(batch, store))
        for name, value in list((node.get("params") or {}).items()):
            if node.get("type") == "workflow" and name in SUB_PARAMS:
                continue
            new = _repaired(value, in_item)
            if new != value:
                node["params"][name] = new
                yield f"node '{node.get('id')}' param {name}"
        if batch and isinstance(batch.get("items"), str):
            new = _repaired(batch["items"], Paths(roots, store))
            if new != batch["items"]:
                batch["items"] = new
                yield f"node '{node.get('id')}' batch.items"
    for name, output in (workflow.get("outputs") or {}).items():
        if isinstance(output, dict) and isinstance(output.get("source"), str):
            new = _repaired(output["source"], Paths(roots, store))
            if new != output["source"]:
                output["source"] = new
                yield f"outputs.{name}.source"


def edge_ends(workflow: dict[str, Any], request: RepairRequest) -> Iterator[str]:
    ids = [n.get("id") for n in workflow.get("nodes", []) if isinstance(n, dict)]
    for edge in workflow.get("edges") or []:
        for end in ("from", "to"):
            if isinstance(edge, dict) and edge.get(end) not in ids and (close := closest(edge.get(end), ids)):
                yield f"edge {end}: {edge[end]} -> {close}"
                edge[end] = close
    start = workflow.get("start_node")
    if start is not None and start not in ids and (close := closest(start, ids)):
        yield f"start_node: {start} -> {close}"
        workflow["start_node"] = close


FIXES: tuple[Callable[[dict[str, Any], RepairRequest], Iterator[str]], ...] = (
    node_types,
    param_names,
    template_refs,
    edge_ends,
)


def _repaired(value: Any, fix: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> Any:
    """`value` with each template whose path `fix` changes rewritten (walks dicts and lists)."""
    if isinstance(value, dict):
        return {k: _repaired(v, fix) for k, v in value.items()}
    if isinstance(value, list):
        return [_repaired(v, fix) for v in value]
    if not isinstance(value, str):
        return value
    try:
        found = references(value)
    except TemplateError:
        return value
    for ref in found:
        path = fix(ref.path)
        if path != ref.path:
            value = value.replace(ref.text, _template(path))
    return value


def _template(path: tuple[Any, ...]) -> str:
    return "${" + "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path)) + "}"


class Paths:
    """Template paths repaired where they are looked up: roots among `roots`, keys among those the store
    (or, for the batch alias, the sample item) has at each level."""

    def __init__(self, roots: set[str], store: dict[str, Any], alias: str | None = None, sample: Any = _NOTHING):
        self.roots, self.store, self.alias, self.sample = roots, store, alias, sample

    def __call__(self, path: tuple[Any, ...]) -> tuple[Any, ...]:
        """`path` with each misspelt name replaced by the closest one that exists."""
        root = str(path[0])
        if root.startswith("_"):
            return path
        if root not in self.roots and root not in self.store:
            root = closest(root, self.roots) or root
        value: Any = self.sample if root == self.alias else self.store.get(root, _NOTHING)
        fixed: list[Any] = [root]
        for part in path[1:]:
            if isinstance(part, str) and isinstance(value, dict) and part not in value:
                part = closest(part, value) or part
            fixed.append(part)
            value = _down(value, part)
        return tuple(fixed)


def _down(value: Any, part: str | int) -> Any:
    """`value[part]` for a dict key or list index that exists, else nothing."""
    if isinstance(part, int):
        return value[part] if isinstance(value, list) and -len(value) <= part < len(value) else _NOTHING
    return value.get(part, _NOTHING) if isinstance(value, dict) else _NOTHING


def _first_item(batch: dict[str, Any] | None, store: dict[str, Any]) -> Any:
    """A batch's first item from the store (the keys an item has), when its items resolve."""
    if not batch or not isinstance(batch.get("items"), str):
        return _NOTHING
    try:
        (ref,) = references(batch["items"])
    except (TemplateError, ValueError):
        return _NOTHING
    value: Any = store
    for part in ref.path:
        value = _down(value, part)
    return value[0] if isinstance(value, list) and value else _NOTHING
