"""Static checks over a parsed workflow: everything that can be known before anything runs.

Each check returns problem strings naming their location; `ir.load` reports them all together.
Warnings work the same way (`ALL_WARNINGS`): `ir.load` attaches them to the workflow it returns.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Iterator

from ir.branches import parallel_problems
from ir.errors import TemplateError, shown, shown_key
from ir.loops import endless_loops, loops_left_only_by_actions
from ir.models import NodeSpec, Workflow
from ir.subworkflows import is_sub_param
from ir.templates import Reference, references

#: Names longer than this get no "did you mean" (difflib's comparison is quadratic in the length).
MAX_SUGGESTED = 200


def _where(index: int, node: NodeSpec) -> str:
    return f"nodes[{index}] (id '{node.id}')"


def _did_you_mean(name: str, candidates: Collection[str]) -> str:
    if len(name) > MAX_SUGGESTED:  # difflib compares in quadratic time
        return ""
    close = difflib.get_close_matches(name, [c for c in candidates if len(c) <= MAX_SUGGESTED], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def duplicate_ids(wf: Workflow) -> Iterator[str]:
    seen: dict[str, int] = {}
    for i, node in enumerate(wf.nodes):
        if node.id in seen:
            yield f"{_where(i, node)}: duplicate node id (first used by nodes[{seen[node.id]}])"
        else:
            seen[node.id] = i


def edges_and_start(wf: Workflow) -> Iterator[str]:
    ids = {n.id for n in wf.nodes}
    for i, edge in enumerate(wf.edges):
        for end, name in (("from", edge.from_), ("to", edge.to)):
            if name not in ids:
                yield f"edges[{i}].{end}: unknown node {shown(name)}{_did_you_mean(name, ids)}"
    if wf.start_node is not None and wf.start_node not in ids:
        yield f"start_node: unknown node {shown(wf.start_node)}{_did_you_mean(wf.start_node, ids)}"


def duplicate_actions(wf: Workflow) -> Iterator[str]:
    """One edge per node and action: PocketFlow keeps only the last, so a second one is a mistake either way."""
    first: dict[tuple[str, str], int] = {}
    for i, edge in enumerate(wf.edges):
        if edge.parallel:  # one per branch, by design (ir/branches.py checks them)
            continue
        key = (edge.from_, edge.action)
        if key not in first:
            first[key] = i
            continue
        j = first[key]
        yield (
            f"edges[{i}]: node {shown(edge.from_)} already has an edge for action {shown(edge.action)} "
            f"(edges[{j}] to {shown(wf.edges[j].to)}); this one goes to {shown(edge.to)}: "
            "an action leads to one node"
        )


def node_types(wf: Workflow, known: Collection[str]) -> Iterator[str]:
    for i, node in enumerate(wf.nodes):
        if node.type not in known:
            yield f"{_where(i, node)}.type: unknown node type {shown(node.type)}{_did_you_mean(node.type, known)}"


def batch_aliases(wf: Workflow) -> Iterator[str]:
    ids = {n.id for n in wf.nodes}
    for i, node in enumerate(wf.nodes):
        if node.batch and node.batch.alias in ids:
            yield f"{_where(i, node)}.batch.as: alias '{node.batch.alias}' shadows the node id '{node.batch.alias}'"


def _ancestors(wf: Workflow) -> dict[str, set[str]]:
    """For each node, the nodes that can run before it (have a path to it)."""
    preds: dict[str, set[str]] = {n.id: set() for n in wf.nodes}
    for edge in wf.effective_edges():
        if edge.to in preds and edge.from_ in preds:
            preds[edge.to].add(edge.from_)
    result: dict[str, set[str]] = {}
    for node_id in preds:
        seen: set[str] = set()
        stack = list(preds[node_id])
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack.extend(preds[current])
        result[node_id] = seen
    return result


def _node_refs(node: NodeSpec) -> Iterator[tuple[str, Reference | TemplateError]]:
    """(where, reference) for each template of the node; a template that cannot be parsed comes as its error.

    A sub-workflow's templates are its own (checked when it is loaded), not the node's."""
    values = [
        (f"params.{shown_key(name)}", value) for name, value in node.params.items() if not is_sub_param(node, name)
    ]
    if node.batch and node.batch.items:
        values.append(("batch.items", node.batch.items))
    for where, value in values:
        try:
            found: list[Reference] | list[TemplateError] = references(value)
        except TemplateError as exc:
            found = [exc]
        for ref in found:
            yield where, ref


def template_references(wf: Workflow) -> Iterator[str]:
    """Templates must point at nodes that exist and run earlier (or at inputs, aliases, dunders)."""
    ids = {n.id for n in wf.nodes}
    inputs = set(wf.inputs or {})
    ancestors = _ancestors(wf)
    for i, node in enumerate(wf.nodes):
        alias = node.batch.alias if node.batch else None
        for where, ref in _node_refs(node):
            if isinstance(ref, TemplateError):
                yield f"{_where(i, node)}.{where}: {ref}"
                continue
            root = ref.root
            if root.startswith("_") or root in inputs or (root == alias and where != "batch.items"):
                continue
            location = f"{_where(i, node)}.{where}"
            if root in ids:
                if root not in ancestors[node.id]:
                    yield f"{location}: {ref.shown} refers to node '{root}', which does not run before '{node.id}'"
                continue
            hint = _did_you_mean(root, ids | inputs)
            if wf.declares_inputs or hint:
                yield f"{location}: {ref.shown} refers to unknown node or input {shown(root)}{hint}"


def output_references(wf: Workflow) -> Iterator[str]:
    """Workflow `outputs` must be templates over nodes or inputs that exist."""
    ids = {n.id for n in wf.nodes}
    inputs = set(wf.inputs or {})
    for name, output in (wf.outputs or {}).items():
        try:
            found = references(output.source)
        except TemplateError as exc:
            yield f"outputs.{name}.source: {exc}"
            continue
        if not found:
            yield f"outputs.{name}.source: must be a template like '${{node.key}}', got {shown(output.source)}"
        for ref in found:
            if ref.root in ids or ref.root in inputs or ref.root.startswith("_"):
                continue
            hint = _did_you_mean(ref.root, ids | inputs)
            if wf.declares_inputs or hint:  # without declared inputs, an unknown name may be a run input
                yield f"outputs.{name}.source: {ref.shown} refers to unknown node or input {shown(ref.root)}{hint}"


ALL_CHECKS = (
    duplicate_ids,
    edges_and_start,
    duplicate_actions,
    parallel_problems,
    batch_aliases,
    template_references,
    output_references,
    endless_loops,
)
ALL_WARNINGS = (loops_left_only_by_actions,)
